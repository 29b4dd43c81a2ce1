#!/usr/bin/python3
"""The CoT training step of bench_train, written the usual way in PyTorch eager (HF-equivalent
modules, grouped-query attention, tied head on the labelled tokens): same shapes, batch, labels and
AdamW. Prints the median step time per model; compare with bench_train's CoT rows from the same
machine and libtorch. On a GPU: --device cuda --bf16 (autocast, float32 weights, as bench_train
--bf16) --only llama-3.2-1B --batch 8 --length 1024 --question 512; --sdpa uses PyTorch's fused
scaled_dot_product_attention instead of the written-out softmax (what HF picks by default).
With --latents 6, also Coconut steps the way the official code runs them on HF (a pass for the
columns before the thoughts, one per thought fed the previous last hidden state, then the rest, over
past_key_values kept in the graph), as bench_train's Coconut rows.
With --lockstep (one model in --only): prints `ready`, then for each line read on stdin (a thought
count, 0 for CoT) runs two steps and prints the second's milliseconds, as bench_train --lockstep does, so that
bench/train_vs_eager.sh can alternate the two a step at a time.
Usage: python3 bench/train_step_eager.py [--threads 2] [--repeats 5] [--device cpu] [--only 1M 25M] [--latents 6]"""
import argparse, math, sys, time
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
    def __init__(self, width, inner, heads, kv_heads, sdpa):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.sdpa = heads, kv_heads, width // heads, sdpa
        kv_width = kv_heads * self.head_dim
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(width), RMSNorm(width)
        self.q_proj, self.k_proj = nn.Linear(width, width, bias=False), nn.Linear(width, kv_width, bias=False)
        self.v_proj, self.o_proj = nn.Linear(width, kv_width, bias=False), nn.Linear(width, width, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(width, inner, bias=False), nn.Linear(width, inner, bias=False)
        self.down_proj = nn.Linear(inner, width, bias=False)

    def forward(self, x, cos, sin, mask, past=None):
        """x [B, T, D]; past: this layer's (K, V) [B, G, S, hd] of earlier columns (Coconut's passes,
        HF's past_key_values), kept in the graph. Returns the output and the grown (K, V)."""
        B, T, D = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # [B, H, T, hd]
        k, v = (p(h).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2) for p in (self.k_proj, self.v_proj))
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if past is not None:
            k, v = torch.cat((past[0], k), 2), torch.cat((past[1], v), 2)  # [B, G, S, hd]
        grown = (k, v)
        repeat = self.heads // self.kv_heads  # each KV head serves `repeat` query heads (HF's repeat_kv)
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)  # [B, H, S, hd]
        if self.sdpa:
            causal = past is None and T > 1
            allowed = None if causal or mask is None else mask == 0  # [T, S] bool
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=causal)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
            attended = (scores if mask is None else scores + mask).softmax(-1) @ v
        x = x + self.o_proj(attended.transpose(1, 2).reshape(B, T, D))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), grown


class Llama(nn.Module):
    def __init__(self, width, inner, layers, heads, kv_heads, vocab, sdpa):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width, inner, heads, kv_heads, sdpa) for _ in range(layers))
        self.norm, self.head_dim = RMSNorm(width), width // heads

    def run(self, x, start, past):
        """The columns [start, start + T) of embeddings x [B, T, D] over the cached earlier ones:
        the final-normed hidden states and every layer's grown (K, V)."""
        T, device = x.shape[1], x.device
        inv = 1.0 / (10000.0 ** (torch.arange(0, self.head_dim, 2, device=device).float() / self.head_dim))
        angles = torch.outer(torch.arange(start, start + T, device=device).float(), inv)
        angles = torch.cat((angles, angles), -1)
        cos, sin = angles.cos(), angles.sin()
        # [T, S]: column start + i sees keys 0 .. start + i; one new column sees every key.
        mask = None if T == 1 else torch.full((T, start + T), float("-inf"), device=device).triu(start + 1)
        grown = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, mask, None if past is None else past[i])
            grown.append(kv)
        return self.norm(x), grown

    def forward(self, ids, labels, first_latent=0, thoughts=0):
        """Next-token loss on the labelled tokens; with thoughts, Coconut's passes as the official
        code runs them on HF: the columns before the first thought, then one pass per thought whose
        input is the previous column's last hidden state, then the rest, over the growing cache."""
        x = self.embed_tokens(ids)
        if thoughts == 0:
            hidden, _ = self.run(x, 0, None)
        else:
            parts = []
            hidden, past = self.run(x[:, :first_latent], 0, None)
            parts.append(hidden)
            for i in range(thoughts):
                hidden, past = self.run(hidden[:, -1:], first_latent + i, past)
                parts.append(hidden)
            rest, _ = self.run(x[:, first_latent + thoughts:], first_latent + thoughts, past)
            hidden = torch.cat(parts + [rest], 1)
        hidden = hidden[:, :-1]
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
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast, float32 weights")
    parser.add_argument("--sdpa", action="store_true", help="fused attention (scaled_dot_product_attention)")
    parser.add_argument("--only", nargs="+", default=["1M", "25M"])
    parser.add_argument("--latents", nargs="*", type=int, default=[],
                        help="also time Coconut steps with these thought counts (bench_train's layout)")
    parser.add_argument("--lockstep", action="store_true",
                        help="two steps per thought count read on stdin, the second's milliseconds printed")
    args = parser.parse_args()
    if args.lockstep and len(args.only) != 1:
        parser.error("--lockstep takes one model in --only")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if not args.lockstep:
        print(f"PyTorch {torch.__version__} eager, {torch.get_num_threads()} threads, {device}, "
              f"{'bf16 autocast' if args.bf16 else 'f32'}, {'sdpa' if args.sdpa else 'written-out'} attention; "
              f"batch {args.batch} x {args.length}")
    shapes = {"1M": (128, 512, 4, 4, 4, 160), "25M": (512, 1536, 8, 8, 8, 160),
              "llama-3.2-1B": (2048, 8192, 16, 32, 8, 128256)}
    for name in args.only:
        width, inner, layers, heads, kv_heads, vocab = shapes[name]
        model = Llama(width, inner, layers, heads, kv_heads, vocab, args.sdpa).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)  # PyTorch's default: foreach on CUDA
        batches = {}
        for thoughts in [0] + args.latents:
            # bench_train's rows: the question (no loss), then <bot>, the thoughts and <eot> (no loss),
            # then labelled tokens.
            ids = torch.randint(8, vocab, (args.batch, args.length), device=device)
            labels = ids.clone()
            unlabelled = args.question + (thoughts + 2 if thoughts else 0)
            labels[:, :unlabelled] = -100
            batches[thoughts] = (ids, labels)

        def train_step(thoughts):
            ids, labels = batches[thoughts]
            optimizer.zero_grad()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
                loss = model(ids, labels, args.question + 1, thoughts)
            loss.backward()
            optimizer.step()

        if args.lockstep:
            print("ready", flush=True)
            for line in sys.stdin:
                train_step(int(line))  # untimed: the timed step starts from what a step leaves, as in training
                start = time.perf_counter()
                train_step(int(line))
                print(f"{(time.perf_counter() - start) * 1e3:.3f}", flush=True)
            return
        cot_step = None
        for thoughts in [0] + args.latents:
            times = []
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            for i in range(args.repeats + 1):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                train_step(thoughts)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i > 0:
                    times.append(time.perf_counter() - start)
            step = sorted(times)[len(times) // 2]
            cot_step = cot_step or step
            memory = ""
            if device.type == "cuda":
                memory = f"  peak {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated"
            label = f"Coconut k={thoughts}" if thoughts else "CoT step"
            print(f"{name:<13} {label:<12} {step * 1e3:8.1f} ms  {args.batch * args.length / step:8.0f} tokens/s"
                  f"  {step / cot_step:5.2f} x CoT{memory}")


if __name__ == "__main__":
    main()
