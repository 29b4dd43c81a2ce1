#!/usr/bin/python3
"""The CoT training step of bench_train, written the usual way in PyTorch eager (Debian's
python3-torch, the same libtorch 1.13 as our C++ build): same shapes, batch, labels and AdamW.
Prints the median step time per model; compare with bench_train's CoT rows from the same machine.
Usage: /usr/bin/python3 bench/train_step_eager.py [--threads 2] [--repeats 5]"""
import argparse, math, time
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(width)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    def __init__(self, width, inner, heads):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(width), RMSNorm(width)
        self.q_proj, self.k_proj = nn.Linear(width, width, bias=False), nn.Linear(width, width, bias=False)
        self.v_proj, self.o_proj = nn.Linear(width, width, bias=False), nn.Linear(width, width, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(width, inner, bias=False), nn.Linear(width, inner, bias=False)
        self.down_proj = nn.Linear(inner, width, bias=False)

    def forward(self, x, cos, sin, mask):
        B, T, D = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(B, T, self.heads, self.head_dim).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim) + mask
        x = x + self.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, width, inner, layers, heads, vocab):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width, inner, heads) for _ in range(layers))
        self.norm, self.head_dim = RMSNorm(width), width // heads

    def forward(self, ids, labels):
        B, T = ids.shape
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(T).float(), inv)
        angles = torch.cat((angles, angles), -1)
        cos, sin = angles.cos(), angles.sin()
        mask = torch.full((T, T), float("-inf")).triu(1)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        hidden = self.norm(x)[:, :-1]
        targets = labels[:, 1:]
        keep = targets != -100
        logits = hidden[keep] @ self.embed_tokens.weight.t()  # tied head, labelled tokens only
        return F.cross_entropy(logits, targets[keep])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=160)
    parser.add_argument("--question", type=int, default=105)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"PyTorch {torch.__version__} eager, {torch.get_num_threads()} threads; batch {args.batch} x {args.length}")
    for name, (width, inner, layers, heads) in {"1M (demo)": (128, 512, 4, 4), "25M": (512, 1536, 8, 8)}.items():
        model = Llama(width, inner, layers, heads, 160)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(8, 160, (args.batch, args.length))
        labels = ids.clone()
        labels[:, : args.question] = -100
        times = []
        for i in range(args.repeats + 1):
            start = time.perf_counter()
            optimizer.zero_grad()
            model(ids, labels).backward()
            optimizer.step()
            if i > 0:
                times.append(time.perf_counter() - start)
        step = sorted(times)[len(times) // 2]
        print(f"{name:<10} CoT step {step * 1e3:8.1f} ms  {args.batch * args.length / step:8.0f} tokens/s")


if __name__ == "__main__":
    main()
