"""Sizing of a Quiver inference node: GPU memory split, adapters per tier, cost per adapter-hour.

Usage:
    python scripts/sizing.py                  # print the tables of docs/deploy.md ("Sizing")
    python scripts/sizing.py --write          # rewrite that section of docs/deploy.md in place
    python scripts/sizing.py --price H100=2.5 --max-loras 16 --cpu-cache-gib 64

Every figure in the guide comes from here; tests/test_sizing.py checks that the guide equals this output.

The memory model is vLLM's (0.32, `vllm/worker/gpu_worker.py`, `vllm/lora/layers/`):
- the engine takes `gpu_memory_utilization` x the GPU's memory; weights (bf16) are split over `TP` GPUs;
- LoRA slots are preallocated at start-up for `max_loras` adapters at `max_lora_rank` on every linear module
  vLLM can adapt (q, k, v, o, gate, up, down), whatever an adapter targets: a small-rank adapter pays the padded
  size. Column-parallel modules (q, k, v, gate, up) shard `lora_b`, row-parallel ones (o, down) shard `lora_a`
  (vLLM's default, not `--fully-sharded-loras`);
- a fixed per-GPU overhead for activations, CUDA graphs and the CUDA context (an assumption: read the real figure
  from the engine's start-up log and pass `--overhead-gib`);
- the KV cache gets the rest: 2 (K and V) x layers x KV heads / TP x head_dim x 2 bytes per token and GPU;
- the engine's CPU cache (`max_cpu_loras`) holds adapters at their own size in host memory, one copy per
  tensor-parallel worker (each worker has its own LoRA manager).
Adapters are assumed to target all seven projections (the largest they can be at a rank).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

GIB = 2**30
MIB = 2**20
BF16 = 2  # bytes per weight, KV element and adapter weight
RANKS = (8, 16, 64)
TP_CHOICES = (1, 2, 4, 8)
MAX_MODEL_LEN = 8192  # base/kustomization.yaml QUIVER_MAX_MODEL_LEN
GPU_MEMORY_UTILIZATION = 0.90  # vLLM's default and base/kustomization.yaml's
MAX_LORAS = 8  # base/kustomization.yaml QUIVER_MAX_LORAS
OVERHEAD_GIB = 2.0  # per GPU: activations at the profiling batch, CUDA graphs, context (assumption)
CPU_CACHE_GIB = 32.0  # host memory per GPU for the engine's CPU LoRA cache (a choice)
DISK_CACHE_GIB = 90.0  # the node-local disk tier: QUIVER_NODE_CACHE_MAX_BYTES in platform/k8s/base
MIN_CONTEXTS = 4  # the smallest TP chosen must leave KV for this many full-length sequences
DOC = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
BEGIN, END = "<!-- sizing:begin (python scripts/sizing.py --write) -->", "<!-- sizing:end -->"


@dataclass(frozen=True)
class Model:
    """A decoder's shapes, as in its Hugging Face `config.json`.

    Attributes:
        name: display name.
        hidden: `hidden_size`.
        intermediate: `intermediate_size`.
        layers: `num_hidden_layers`.
        heads: `num_attention_heads`.
        kv_heads: `num_key_value_heads`.
        vocab: `vocab_size` (embeddings and an untied `lm_head`).
        source: where the shapes come from.
    """

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    source: str

    @property
    def head_dim(self) -> int:
        """`hidden / heads` (128 for both Llama-3 sizes)."""
        return self.hidden // self.heads

    def modules(self, tp: int = 1) -> list[tuple[str, int, int, bool]]:
        """`(name, d_in, d_out, column_parallel)` of the seven adaptable projections of one layer."""
        h, kv, i = self.hidden, self.kv_heads * self.head_dim, self.intermediate
        return [("q", h, h, True), ("k", h, kv, True), ("v", h, kv, True), ("o", h, h, False),
                ("gate", h, i, True), ("up", h, i, True), ("down", i, h, False)]

    @property
    def params(self) -> int:
        """Parameter count: embeddings + untied lm_head + per layer (projections + 2 norms) + final norm."""
        per_layer = sum(d_in * d_out for _, d_in, d_out, _ in self.modules()) + 2 * self.hidden
        return 2 * self.vocab * self.hidden + self.layers * per_layer + self.hidden

    def weight_bytes(self) -> int:
        """bf16 weights of the whole model, bytes."""
        return self.params * BF16

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV cache per token on one of `tp` GPUs, bytes (KV heads are split over TP)."""
        return 2 * self.layers * (self.kv_heads // tp) * self.head_dim * BF16

    def adapter_bytes(self, r: int) -> int:
        """An all-linear LoRA of rank `r` (A: r x d_in, B: d_out x r per module), bytes in bf16."""
        return r * sum(d_in + d_out for _, d_in, d_out, _ in self.modules()) * self.layers * BF16

    def slot_bytes_per_gpu(self, r: int, tp: int) -> int:
        """One preallocated LoRA slot at `max_lora_rank = r`, on one of `tp` GPUs, bytes."""
        per_layer = sum(r * (d_in + d_out // tp) if column else r * (d_in // tp + d_out)
                        for _, d_in, d_out, column in self.modules())
        return per_layer * self.layers * BF16


@dataclass(frozen=True)
class Gpu:
    """A GPU type.

    Attributes:
        name: display name.
        memory_gib: memory on the datasheet, read as GiB (drivers and ECC keep some; the 10 % that
            `gpu_memory_utilization` leaves covers it).
        price: USD per GPU-hour, on-demand.
        price_source: where the price comes from.
    """

    name: str
    memory_gib: float
    price: float
    price_source: str


LLAMA_3_8B = Model("Llama-3-8B", 4096, 14336, 32, 32, 8, 128256,
                   "huggingface.co/meta-llama/Meta-Llama-3-8B config.json")
LLAMA_3_70B = Model("Llama-3-70B", 8192, 28672, 80, 64, 8, 128256,
                    "huggingface.co/meta-llama/Meta-Llama-3-70B config.json")
MODELS = (LLAMA_3_8B, LLAMA_3_70B)
GPUS = (
    Gpu("L4", 24, 0.44, "RunPod on-demand, deploybase.ai/articles/nvidia-l4-price (2026)"),
    Gpu("A10G", 24, 1.006, "AWS g5.xlarge on-demand us-east-1, factualminds.com EC2 on-demand pricing (June 2026)"),
    Gpu("A100-40GB", 40, 1.844, "AWS EC2 Capacity Blocks p4d.24xlarge, per accelerator-hour (aws.amazon.com/ec2/"
        "capacityblocks/pricing, rates to 2025-01-01)"),
    Gpu("A100-80GB", 80, 1.99, "midpoint of $1.49-2.49 on-demand, pricegpu.pages.dev H100 vs A100 (early 2026)"),
    Gpu("H100-80GB", 80, 4.916, "AWS EC2 Capacity Blocks p5.48xlarge, per accelerator-hour (same page)"),
    Gpu("H200-141GB", 141, 5.408, "AWS EC2 Capacity Blocks 8 x H200, per accelerator-hour (same page)"),
)


@dataclass(frozen=True)
class Options:
    """Knobs of the sizing (defaults match platform/k8s/base)."""

    max_loras: int = MAX_LORAS
    overhead_gib: float = OVERHEAD_GIB
    cpu_cache_gib: float = CPU_CACHE_GIB
    disk_cache_gib: float = DISK_CACHE_GIB
    utilization: float = GPU_MEMORY_UTILIZATION
    max_model_len: int = MAX_MODEL_LEN


@dataclass(frozen=True)
class NodePlan:
    """The memory split and tier capacities of one node (`tp` GPUs of one type) for one model and rank.

    All byte figures are per node (summed over its GPUs).
    """

    model: Model
    gpu: Gpu
    r: int
    tp: int
    budget: float
    weights: float
    overhead: float
    lora_slots: float
    kv: float
    kv_tokens: int
    gpu_adapters: int
    cpu_adapters: int
    disk_adapters: int

    @property
    def node_price(self) -> float:
        """USD per node-hour."""
        return self.gpu.price * self.tp


def plan(model: Model, gpu: Gpu, r: int, options: Options) -> NodePlan | None:
    """The smallest tensor-parallel node that fits, or None when even TP=8 leaves too little KV cache.

    A TP fits when the KV cache left holds `MIN_CONTEXTS` sequences of `max_model_len` tokens.
    """
    for tp in TP_CHOICES:
        if model.kv_heads % tp:
            continue
        budget = gpu.memory_gib * GIB * options.utilization
        weights = model.weight_bytes() / tp
        slots = options.max_loras * model.slot_bytes_per_gpu(r, tp)
        overhead = options.overhead_gib * GIB
        kv = budget - weights - slots - overhead
        tokens = math.floor(kv / model.kv_bytes_per_token(tp)) if kv > 0 else 0
        if tokens >= MIN_CONTEXTS * options.max_model_len:
            adapter = model.adapter_bytes(r)
            return NodePlan(model=model, gpu=gpu, r=r, tp=tp, budget=budget * tp, weights=weights * tp,
                            overhead=overhead * tp, lora_slots=slots * tp, kv=kv * tp, kv_tokens=tokens,
                            gpu_adapters=options.max_loras,
                            # Each TP worker keeps a full copy, and gets cpu_cache_gib of host memory.
                            cpu_adapters=math.floor(options.cpu_cache_gib * GIB / adapter),
                            disk_adapters=math.floor(options.disk_cache_gib * GIB / adapter))
    return None


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def render(options: Options) -> str:
    """The markdown of the sizing section (model shapes, memory split, tiers and cost)."""
    out = [f"Computed by `python scripts/sizing.py` with max_loras {options.max_loras}, "
           f"gpu_memory_utilization {options.utilization}, {options.overhead_gib} GiB overhead per GPU, "
           f"max_model_len {options.max_model_len}, {options.cpu_cache_gib:g} GiB of host memory per GPU for the "
           f"engine's CPU cache and {options.disk_cache_gib:g} GiB of node disk per node; bf16 everywhere.", "",
           "**Model shapes** (`config.json`) and what follows from them:", ""]
    out += _table(
        ["model", "hidden", "intermediate", "layers", "heads / KV heads", "vocab", "params", "weights GiB",
         "KV per token KiB", *(f"adapter r{r} MiB" for r in RANKS)],
        [[m.name, m.hidden, m.intermediate, m.layers, f"{m.heads} / {m.kv_heads}", m.vocab, f"{m.params / 1e9:.2f} B",
          _gib(m.weight_bytes()), m.kv_bytes_per_token() // 1024, *(f"{m.adapter_bytes(r) / MIB:.0f}" for r in RANKS)]
         for m in MODELS])
    plans = [(m, g, r, plan(m, g, r, options)) for m in MODELS for g in GPUS for r in RANKS]
    out += ["", "**GPU memory split of a node** (GiB, summed over the node's TP GPUs; `max_loras` slots at the "
            "padded rank `max_lora_rank` = r):", ""]
    rows: list[list[object]] = []
    for m, g, r, p in plans:
        if p is None:
            rows.append([m.name, g.name, r, "does not fit", "", "", "", "", "", "", ""])
            continue
        slot_tokens = math.floor(p.lora_slots / p.tp / m.kv_bytes_per_token(p.tp))
        rows.append([m.name, g.name, r, p.tp, _gib(p.budget), _gib(p.weights), _gib(p.overhead), _gib(p.lora_slots),
                     _gib(p.kv), f"{p.kv_tokens:,}", f"{p.kv_tokens // options.max_model_len} ({slot_tokens:,})"])
    out += _table(["model", "GPU", "r", "TP", "engine budget", "weights", "overhead", "LoRA slots", "KV cache",
                   "KV tokens", "full contexts (KV tokens the slots cost)"], rows)
    out += ["", "**Adapters per tier and cost** (GPU = `max_loras`; CPU = engine cache in host memory = a good "
            "`max_cpu_loras`; disk = node cache; S3 holds any number). Dedicated = one node per fine-tune (merged weights, "
            "no LoRA slots); shared = the node's price over the adapters it keeps resident (GPU + CPU tiers):", ""]
    rows = []
    for m, g, r, p in plans:
        if p is None:
            continue
        # vLLM needs max_cpu_loras >= max_loras: a smaller CPU tier means too little host memory.
        resident = max(p.cpu_adapters, p.gpu_adapters)
        cpu = f"{p.cpu_adapters:,}" if p.cpu_adapters >= p.gpu_adapters else f"{p.cpu_adapters} (< max_loras)"
        # A dedicated deployment serves one merged fine-tune: no LoRA slots, so maybe fewer GPUs.
        dedicated = plan(m, g, r, replace(options, max_loras=0))
        dedicated_price = (dedicated or p).node_price
        shared = p.node_price / resident
        rows.append([m.name, g.name, r, p.gpu_adapters, cpu, f"{p.disk_adapters:,}",
                     f"{dedicated_price:.3f}", f"{shared:.5f}", f"{dedicated_price / shared:,.0f}x"])
    out += _table(["model", "GPU", "r", "GPU", "CPU", "disk", "dedicated $/h", "shared $/adapter-hour",
                   "saving"], rows)
    out += ["", "Prices (USD per GPU-hour, on-demand unless noted; override with `--price GPU=USD`):", ""]
    out += [f"- {g.name}: {g.memory_gib:g} GB, ${g.price} ({g.price_source})" for g in GPUS]
    out += [f"- Shapes: {m.name}, {m.source}" for m in MODELS]
    return "\n".join(out) + "\n"


def replace_section(doc: str, section: str) -> str:
    """`doc` with the text between the sizing markers replaced by `section`.

    Raises:
        ValueError: the markers are missing.
    """
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(doc):
        raise ValueError(f"{DOC.name} has no {BEGIN} … {END} section")
    return pattern.sub(lambda _: f"{BEGIN}\n{section}{END}", doc)


def section_of(doc: str) -> str:
    """The text between the sizing markers of `doc` (what `render` printed when it was written)."""
    start = doc.index(BEGIN) + len(BEGIN) + 1
    return doc[start:doc.index(END)]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print the tables, or `--write` them into docs/deploy.md. Returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-loras", type=int, default=MAX_LORAS)
    parser.add_argument("--overhead-gib", type=float, default=OVERHEAD_GIB)
    parser.add_argument("--cpu-cache-gib", type=float, default=CPU_CACHE_GIB)
    parser.add_argument("--disk-cache-gib", type=float, default=DISK_CACHE_GIB)
    parser.add_argument("--price", action="append", default=[], metavar="GPU=USD")
    parser.add_argument("--write", action="store_true", help=f"rewrite the sizing section of {DOC}")
    args = parser.parse_args(argv)
    global GPUS
    for item in args.price:
        name, _, value = item.partition("=")
        if name not in {g.name for g in GPUS}:
            parser.error(f"--price {item}: unknown GPU {name!r}; one of {', '.join(g.name for g in GPUS)}")
        GPUS = tuple(Gpu(g.name, g.memory_gib, float(value), "--price") if g.name == name else g for g in GPUS)
    text = render(Options(max_loras=args.max_loras, overhead_gib=args.overhead_gib,
                          cpu_cache_gib=args.cpu_cache_gib, disk_cache_gib=args.disk_cache_gib))
    if args.write:
        DOC.write_text(replace_section(DOC.read_text(), text))
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
