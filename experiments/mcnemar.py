"""McNemar's exact test for two schemes answering the same questions (imported by the report scripts)."""
import math


def mcnemar(first, second):
    """Discordant counts and the exact two-sided p-value of paired right/wrong lists: (right only in
    `first`, right only in `second`, p) under H0 "either is as likely on a question they disagree on"."""
    b = sum(1 for x, y in zip(first, second) if x and not y)
    c = sum(1 for x, y in zip(first, second) if y and not x)
    n = b + c
    if n == 0:
        return b, c, 1.0
    return b, c, min(1.0, 2 * sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n)
