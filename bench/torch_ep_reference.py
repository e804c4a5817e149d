"""PyTorch + NCCL baseline of the expert-parallel MoE layer on several GPUs (one process per GPU).

The Megatron "alltoall" way, for tilemoe's multi-GPU benchmarks:
  1. all_to_all_single bandwidth with equal splits (the ceiling NCCL gives on this node);
  2. dispatch and combine alone (identity experts) at the DeepEP shape (4096 tokens per rank,
     hidden 7168, 256 experts, top-8) and the decode shape (128 tokens per rank): the counts
     all-to-all with its host sync, then the rows;
  3. the whole layer at Mixtral-8x7B and DeepSeek-V3, 4096 and 16384 tokens per rank:
     softmax/top-k, argsort permute, counts + rows all-to-all, a local sort by expert,
     torch._grouped_mm GEMM0 + SwiGLU + GEMM1, the way back, the top-k weighted sum.
Balanced routing (N(0,1) logits), random bf16 data; CUDA events, warm-up, medians; every
rank measures, rank 0 reports the slowest rank's median. Start it with
  torchrun --nproc-per-node N bench/torch_ep_reference.py --json FILE
(NCCL_NVLS_ENABLE=0 in the environment: never NVLink multicast on shared machines).
"""
import argparse
import json
import math
import os

import torch
import torch.distributed as dist


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def timed(fn, runs, warmup=3):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for i in range(runs + warmup):
        dist.barrier()
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            out.append(start.elapsed_time(end))
    # the step takes its slowest rank's time
    t = torch.tensor([median(out)], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def route(logits, top_k):
    probs = torch.softmax(logits.float(), dim=-1)
    weight, expert = torch.topk(probs, top_k, dim=-1)
    return weight / weight.sum(dim=-1, keepdim=True), expert


class Exchange:
    """The dispatch and the combine of one step for given routing (host sync on the counts)."""

    def __init__(self, expert, experts, world):
        self.world = world
        self.local = experts // world
        flat = expert.reshape(-1)
        self.order = torch.argsort(flat, stable=True)  # slots grouped by expert, so by owner
        send_counts = torch.bincount(flat // self.local, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        # which local expert each received row is for: the per-expert counts travel too
        per_expert = torch.bincount(flat, minlength=experts).view(world, self.local)
        recv_per_expert = torch.empty_like(per_expert)
        dist.all_to_all_single(recv_per_expert, per_expert)
        self.send_splits = send_counts.tolist()  # the host sync that defines this path
        self.recv_splits = recv_counts.tolist()
        sources = recv_per_expert  # [source, local expert]
        local_ids = torch.arange(self.local, device=expert.device).repeat(world)
        self.recv_expert = torch.repeat_interleave(local_ids, sources.reshape(-1))
        self.expert_order = torch.argsort(self.recv_expert, stable=True)  # source-major -> expert-major
        self.expert_counts = torch.bincount(self.recv_expert, minlength=self.local)

    def dispatch(self, rows):
        out = rows.new_empty((sum(self.recv_splits), rows.shape[1]))
        dist.all_to_all_single(out, rows, output_split_sizes=self.recv_splits, input_split_sizes=self.send_splits)
        return out

    def combine(self, rows):
        out = rows.new_empty((sum(self.send_splits), rows.shape[1]))
        dist.all_to_all_single(out, rows, output_split_sizes=self.send_splits, input_split_sizes=self.recv_splits)
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if os.environ.get("NCCL_NVLS_ENABLE", "0") != "0":
        raise SystemExit("NCCL_NVLS_ENABLE must be 0: no NVLink multicast on shared machines")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda")
    reporter = rank == 0
    sink = open(args.json, "w") if args.json and reporter else None
    runs = 5 if args.quick else 20

    def report(doc, text):
        if reporter:
            print(text, flush=True)
            if sink:
                sink.write(json.dumps(doc) + "\n")
                sink.flush()

    report({"kind": "setup", "torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())), "ranks": world,
            "gpu": torch.cuda.get_device_name()},
           f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, {world} x {torch.cuda.get_device_name()}")

    # 1. all_to_all_single with equal splits
    for mib in ([64] if args.quick else [1, 16, 64, 256, 448]):
        count = (mib << 20) // 2 // world * world
        src = torch.randn(count, device=dev).bfloat16()
        dst = torch.empty_like(src)
        ms = timed(lambda: dist.all_to_all_single(dst, src), runs)
        gbps = count * 2 / (ms * 1e-3) / 1e9
        report({"kind": "alltoall", "mib_per_rank": mib, "ms": ms, "gbps_per_rank": gbps},
               f"all_to_all_single {mib:4d} MiB per rank: {ms * 1e3:9.1f} us, {gbps:7.1f} GB/s per rank")

    gen = torch.Generator(device=dev).manual_seed(100 + rank)

    # 2. dispatch and combine alone
    for name, tokens, hidden, experts, top_k in [("deepep", 4096, 7168, 256, 8), ("decode", 128, 7168, 256, 8)]:
        x = torch.randn(tokens, hidden, device=dev, generator=gen).bfloat16()
        logits = torch.randn(tokens, experts, device=dev, generator=gen)
        weight, expert = route(logits, top_k)

        def dispatch():
            ex = Exchange(expert, experts, world)
            return ex, ex.dispatch(x[ex.order // top_k])

        dispatch_ms = timed(dispatch, runs)
        ex, received = dispatch()
        combine_ms = timed(lambda: ex.combine(received), runs)
        sent = tokens * top_k * hidden * 2
        report({"kind": "exchange", "shape": name, "tokens": tokens, "dispatch_us": dispatch_ms * 1e3, "combine_us": combine_ms * 1e3,
                "dispatch_gbps_per_rank": sent / (dispatch_ms * 1e-3) / 1e9, "combine_gbps_per_rank": sent / (combine_ms * 1e-3) / 1e9},
               f"{name:8s} dispatch {dispatch_ms * 1e3:9.1f} us  combine {combine_ms * 1e3:9.1f} us  "
               f"({sent / (dispatch_ms * 1e-3) / 1e9:.1f} / {sent / (combine_ms * 1e-3) / 1e9:.1f} GB/s per rank)")

    # 3. the whole layer
    shapes = [("mixtral-8x7b", 4096, 14336, 8, 2), ("deepseek-v3", 7168, 2048, 256, 8)]
    for name, hidden, ffn, experts, top_k in shapes:
        if experts % world:
            continue
        local = experts // world
        wgen = torch.Generator(device=dev).manual_seed(7 + rank)
        w13 = ((torch.rand(local, 2 * ffn, hidden, device=dev, generator=wgen) * 2 - 1) * math.sqrt(3 / hidden)).bfloat16()
        w2 = ((torch.rand(local, hidden, ffn, device=dev, generator=wgen) * 2 - 1) * math.sqrt(3 / ffn)).bfloat16()
        w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)
        for tokens in ([4096] if args.quick else [4096, 16384]):
            x = torch.randn(tokens, hidden, device=dev, generator=gen).bfloat16()
            logits = torch.randn(tokens, experts, device=dev, generator=gen)

            def layer():
                weight, expert = route(logits, top_k)
                ex = Exchange(expert, experts, world)
                rows = ex.dispatch(x[ex.order // top_k])
                rows = rows[ex.expert_order]
                offsets = torch.cumsum(ex.expert_counts, 0).to(torch.int32)
                h = torch._grouped_mm(rows, w13_t, offs=offsets)
                act = (torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2]).bfloat16()
                y = torch._grouped_mm(act, w2_t, offs=offsets)
                back = torch.empty_like(y)
                back[ex.expert_order] = y
                returned = ex.combine(back)
                out = torch.zeros(tokens, hidden, device=dev, dtype=torch.float32)
                slot_weight = weight.reshape(-1)[ex.order]
                out.index_add_(0, ex.order // top_k, returned.float() * slot_weight[:, None])
                return out.bfloat16()

            ms = timed(layer, runs)
            report({"kind": "layer", "shape": name, "tokens_per_rank": tokens, "ms": ms},
                   f"{name:13s} {tokens:6d} tokens per rank: layer {ms:8.3f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
