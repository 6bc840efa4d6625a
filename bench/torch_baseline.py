#!/usr/bin/env python3
"""PyTorch implementations of the decode steps bench_kv_fp8 times, on the same GPU and caches.

The baseline a user would write with torch alone (float8_e4m3fn storage, index_select gathers,
matmuls, torch.topk), timed the way bench_kv_fp8 times its kernels: a CUDA graph of K steps that
rotate over input copies larger than the L2 together, median of graph time / K over replays.

  - indexer: rotate + quantise the query (Hadamard, power-of-two scale, e4m3), gather the sequence's
    pages of the paged e4m3 key cache (64 tokens per page, 132 B per token), relu(q . k) weighted
    and summed over the heads, times the key scale, masked past each row's bound, then top-2048.
    Cases: 8K and 128K keys, 1 row and 4 sequences x 4 rows; 64 heads, d = 128.
  - sparse_mla: gather the 2048 selected 656-byte entries (512 e4m3 with 4 tile scales, 64 bf16 RoPE
    dims), dequantise, softmax(q k^T * scale) v over the latent. Cases: 64, 8 and 128 heads x 1 row,
    64 heads x 16 rows; pool of 2^20 entries.

Writes {case: microseconds} as JSON (--out), which `bench_kv_fp8 --torch FILE` prints next to its
own figures. Case names are shared with bench_kv_fp8.

  python3 bench/torch_baseline.py --out /tmp/torch_baseline.json [--reps 20]
"""
import argparse
import json
import math

import torch

PAGE = 64
D = 128
TOPK = 2048


def time_graph(step, copies, reps):
    """Median over replays of (graph of K steps over `copies` inputs) / K, in microseconds."""
    k = copies * max(1, (24 + copies - 1) // copies)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for c in range(copies):  # warm-up outside the graph
            step(c)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for i in range(k):
            step(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / k)
    times.sort()
    return times[len(times) // 2]


def hadamard(d, device):
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def pow2_scale(amax):
    return torch.exp2(torch.ceil(torch.log2(torch.clamp(amax, min=1e-4) / 448.0)))


def bench_indexer(n_keys, n_seqs, rows_per_seq, heads, reps, dev):
    pages_per_seq = (n_keys + PAGE - 1) // PAGE
    pages_per_copy = pages_per_seq * n_seqs
    page_bytes = PAGE * (D + 4)
    copies = max(2, min(64, (120 << 20) // (pages_per_copy * page_bytes) + 1))
    n_pages = copies * pages_per_copy
    # The pool: per page 64 x 128 e4m3 keys, then 64 f32 scales (2^-6).
    keys8 = (torch.rand(n_pages, PAGE, D, device=dev) * 4 - 2).to(torch.float8_e4m3fn)
    kscale = torch.full((n_pages, PAGE), 2.0 ** -6, device=dev)
    tables = torch.arange(n_pages, device=dev, dtype=torch.int64).view(copies, n_seqs, pages_per_seq)
    rows = n_seqs * rows_per_seq
    q = torch.rand(rows, heads, D, device=dev) * 2 - 1
    w = torch.rand(rows, heads, device=dev) * 2 - 1
    bounds = torch.tensor([n_keys - rows_per_seq + 1 + j for _ in range(n_seqs) for j in range(rows_per_seq)],
                          device=dev)
    row_seq = torch.arange(n_seqs, device=dev).repeat_interleave(rows_per_seq)
    H = hadamard(D, dev)
    col = torch.arange(n_keys, device=dev)
    softmax_scale = 1.0 / math.sqrt(D)

    def step(c):
        qr = q @ H
        qs = pow2_scale(qr.abs().amax(-1, keepdim=True))
        q8 = (qr / qs).to(torch.float8_e4m3fn).float()
        wq = w * qs.squeeze(-1) * softmax_scale
        pages = tables[c]                                        # [seqs, pages]
        k = keys8[pages].float().view(n_seqs, pages_per_seq * PAGE, D)[:, :n_keys]
        ks = kscale[pages].view(n_seqs, pages_per_seq * PAGE)[:, :n_keys]
        qg = q8.view(n_seqs, rows_per_seq * heads, D)
        dots = torch.relu(torch.bmm(qg, k.transpose(1, 2)))     # [seqs, rows*heads, keys]
        dots = dots.view(n_seqs, rows_per_seq, heads, n_keys)
        logits = (dots * wq.view(n_seqs, rows_per_seq, heads, 1)).sum(2) * ks.unsqueeze(1)
        logits = logits.view(rows, n_keys).masked_fill(col.unsqueeze(0) >= bounds.unsqueeze(1), -math.inf)
        return torch.topk(logits, TOPK, dim=-1)

    del row_seq
    return time_graph(step, copies, reps)


def bench_sparse_mla(rows, heads, reps, dev, n_slots=1 << 20):
    dk, dv = 576, 512
    copies = max(2, min(128, (120 << 20) // (rows * TOPK * 656) + 1))
    lat8 = (torch.rand(n_slots, dv, device=dev) * 4 - 2).to(torch.float8_e4m3fn)
    tscale = torch.full((n_slots, 4), 2.0 ** -6, device=dev)
    rope = (torch.rand(n_slots, dk - dv, device=dev) * 2 - 1).to(torch.bfloat16)
    idx = torch.randint(0, n_slots, (copies, rows, TOPK), device=dev)
    q = torch.rand(rows, heads, dk, device=dev) * 2 - 1
    scale = 1.0 / math.sqrt(dk)

    def step(c):
        sel = idx[c]                                                          # [rows, topk]
        lat = lat8[sel].float().view(rows, TOPK, 4, 128) * tscale[sel].unsqueeze(-1)
        lat = lat.view(rows, TOPK, dv)
        k = torch.cat([lat, rope[sel].float()], -1)                           # [rows, topk, 576]
        s = torch.bmm(q, k.transpose(1, 2)) * scale                           # [rows, heads, topk]
        p = torch.softmax(s, -1)
        return torch.bmm(p, lat)                                              # [rows, heads, 512]

    return time_graph(step, copies, reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    dev = torch.device("cuda")
    res = {}
    for keys in (8192, 131072):
        for seqs, per in ((1, 1), (4, 4)):
            name = f"indexer keys={keys} rows={seqs}x{per}"
            res[name] = bench_indexer(keys, seqs, per, 64, a.reps, dev)
            print(f"{name}: {res[name]:.1f} us", flush=True)
    for rows, heads in ((1, 64), (1, 8), (16, 64), (1, 128)):
        name = f"sparse_mla heads={heads} rows={rows}"
        res[name] = bench_sparse_mla(rows, heads, a.reps, dev)
        print(f"{name}: {res[name]:.1f} us", flush=True)
    res["device"] = torch.cuda.get_device_name()
    res["torch"] = torch.__version__
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
