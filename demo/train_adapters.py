"""Train one PEFT LoRA adapter per demo task until greedy decoding reproduces every target.

Stopping rule (issue 2, item 7): for every training prompt, teacher-forced argmax equals the target at
each completion step (completion tokens + EOS), and the top-1 minus top-2 logit gap is at least
`TrainConfig.min_margin`, so vLLM's fp32 kernels (different summation order) pick the same tokens.
The base model must not already produce any target. Verification then runs real greedy decoding.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from demo.tasks import TASKS, Example
from demo.tiny_model import load_base, one_torch_thread, save_adapter, served_name_of

ALL_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
EXAMPLES_FILE = "examples.json"
TRAINING_FILE = "training.json"


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters shared by every demo adapter.

    Attributes:
        r: LoRA rank (≤ the node's `--max-lora-rank`, 16 in the notes).
        lora_alpha: LoRA alpha; scale = alpha / r.
        target_modules: Projections to adapt.
        lr: Adam learning rate.
        max_steps: Give up (raise) after this many full-batch steps.
        min_margin: Required top-1 − top-2 logit gap at every generated step (logit units).
        train_margin: Margin the loop trains to; above `min_margin` so padding effects can't break it.
        seed: Seed for LoRA init.
    """

    r: int = 16
    lora_alpha: int = 32
    target_modules: tuple[str, ...] = ALL_PROJECTIONS
    lr: float = 5e-3
    max_steps: int = 500
    min_margin: float = 1.0
    train_margin: float = 3.0
    seed: int = 0


@dataclass
class TrainResult:
    """Outcome of training one adapter.

    Attributes:
        name: Task / adapter name.
        path: Adapter folder.
        steps: Optimiser steps taken (full batch each).
        seconds: Wall time of the training loop.
        min_margin: Smallest top-1 − top-2 logit gap over all generated steps of all prompts.
    """

    name: str
    path: Path
    steps: int
    seconds: float
    min_margin: float


@dataclass(frozen=True)
class EncodedExample:
    """Token ids of one example, split the way inference sees them.

    Attributes:
        prompt_ids: Prompt with BOS, exactly what vLLM's completion endpoint feeds the model.
        target_ids: Completion tokens followed by EOS: the greedy steps to reproduce.
    """

    prompt_ids: list[int]
    target_ids: list[int]


def encode(tokenizer: PreTrainedTokenizerFast, examples: Sequence[Example]) -> list[EncodedExample]:
    """Tokenise prompts and completions separately, as inference sees them.

    Args:
        tokenizer: The demo tokenizer (adds BOS to the prompt).
        examples: Task examples.

    Returns:
        One encoding per example; targets end with EOS.

    Raises:
        ValueError: If a completion does not round-trip through decode (the text would then differ).
    """
    out = []
    for ex in examples:
        completion_ids = tokenizer(ex.completion, add_special_tokens=False).input_ids
        if tokenizer.decode(completion_ids) != ex.completion:
            raise ValueError(f"completion {ex.completion!r} does not round-trip through the tokenizer")
        out.append(EncodedExample(tokenizer(ex.prompt).input_ids, [*completion_ids, tokenizer.eos_token_id]))
    return out


def _batch(encoded: Sequence[EncodedExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad prompt+target rows; labels are -100 except on target positions (shifted by the model)."""
    rows = [e.prompt_ids + e.target_ids for e in encoded]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (e, row) in enumerate(zip(encoded, rows, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, len(e.prompt_ids) : len(row)] = torch.tensor(e.target_ids)
    return ids, mask, labels


def _margins(logits: torch.Tensor, labels: torch.Tensor) -> tuple[bool, float]:
    """Return (every target is the argmax, min of target logit − best other logit) over target positions.

    Args:
        logits: `[batch, seq, vocab]` from the forward pass.
        labels: `[batch, seq]`, -100 outside targets (unshifted, as passed to the model).
    """
    step_logits = logits[:, :-1, :]
    step_labels = labels[:, 1:]
    sel = step_labels != -100
    chosen = step_logits[sel]  # [n_steps, vocab]
    target = step_labels[sel]
    target_logit = chosen.gather(1, target[:, None]).squeeze(1)
    others = chosen.scatter(1, target[:, None], float("-inf"))
    gap = target_logit - others.max(dim=1).values
    return bool((gap > 0).all()), float(gap.min())


def greedy_completion(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, prompt: str, max_new_tokens: int = 8
) -> tuple[str, list[int]]:
    """Decode greedily (no batching, no padding) until EOS or `max_new_tokens`.

    Args:
        model: Base or PEFT model in eval mode.
        tokenizer: The demo tokenizer.
        prompt: Plain completion prompt (BOS is added).
        max_new_tokens: Generation cap.

    Returns:
        `(text, token_ids)`: generated ids (EOS included if produced) and their text without specials.
    """
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    new = out[0, ids.shape[1] :].tolist()
    return tokenizer.decode(new, skip_special_tokens=True), new


def _check_base_differs(
    model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, encoded: Sequence[EncodedExample], name: str
) -> None:
    """Raise if the base model's greedy continuation of any prompt starts with its answer.

    EOS is left out of the comparison: a base that says the answer and keeps talking still answers.
    """
    for e in encoded:
        answer = e.target_ids[:-1]
        ids = torch.tensor([e.prompt_ids])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=len(answer),
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
            )
        if out[0, ids.shape[1] :].tolist() == answer:
            raise RuntimeError(
                f"base model already answers task {name!r} prompt {tokenizer.decode(e.prompt_ids)!r}"
            )


def train_adapter(
    base_dir: Path,
    name: str,
    examples: Sequence[Example],
    out_dir: Path,
    *,
    config: TrainConfig = TrainConfig(),  # noqa: B008 - frozen dataclass, safe as a default
) -> TrainResult:
    """Train and save one LoRA adapter on `examples`.

    Args:
        base_dir: Folder from `demo.tiny_model.build_base_model`.
        name: Task name, recorded in `training.json`.
        examples: The task's prompt/completion pairs.
        out_dir: Adapter folder to write (adapter_config.json, adapter_model.safetensors,
            examples.json, training.json).
        config: Hyper-parameters.

    Returns:
        The training outcome.

    Raises:
        RuntimeError: If the base model already answers a prompt, training does not reach
            `config.train_margin` within `config.max_steps`, or real greedy decoding disagrees.
    """
    base, tokenizer = load_base(base_dir)
    encoded = encode(tokenizer, examples)
    _check_base_differs(base, tokenizer, encoded, name)
    torch.manual_seed(config.seed)
    lora = LoraConfig(
        r=config.r,
        lora_alpha=config.lora_alpha,
        target_modules=list(config.target_modules),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    ids, mask, labels = _batch(encoded, tokenizer.pad_token_id)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=config.lr)
    started = time.perf_counter()
    margin = float("-inf")
    step = 0
    for step in range(1, config.max_steps + 1):  # noqa: B007 - `step` is reported after the loop
        model.train()
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        ok, margin = _margins(out.logits.detach(), labels)
        if ok and margin >= config.train_margin:
            break
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    else:
        raise RuntimeError(f"adapter {name!r} reached margin {margin:.2f} after {config.max_steps} steps")
    seconds = time.perf_counter() - started
    steps = step - 1  # the last pass only measured the margin
    model.eval()
    min_margin = _verify(model, tokenizer, examples, encoded, config.min_margin, name)
    save_adapter(model, out_dir, served_name=served_name_of(base_dir))
    (out_dir / EXAMPLES_FILE).write_text(json.dumps([ex.as_dict() for ex in examples], indent=2) + "\n")
    result = TrainResult(name=name, path=out_dir, steps=steps, seconds=seconds, min_margin=min_margin)
    report = {"name": name, "steps": steps, "seconds": round(seconds, 3), "min_margin": round(min_margin, 3)}
    report["config"] = {**asdict(config), "target_modules": list(config.target_modules)}
    (out_dir / TRAINING_FILE).write_text(json.dumps(report, indent=2) + "\n")
    return result


def _verify(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    examples: Sequence[Example],
    encoded: Sequence[EncodedExample],
    min_margin: float,
    name: str,
) -> float:
    """Check each prompt unpadded: greedy ids equal the target and every step's margin ≥ `min_margin`."""
    worst = float("inf")
    for ex, e in zip(examples, encoded, strict=True):
        text, new = greedy_completion(model, tokenizer, ex.prompt, max_new_tokens=len(e.target_ids) + 2)
        if new != e.target_ids or text != ex.completion:
            raise RuntimeError(f"adapter {name!r}: {ex.prompt!r} → {text!r}, expected {ex.completion!r}")
        ids, mask, labels = _batch([e], tokenizer.pad_token_id)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits
        _, margin = _margins(logits, labels)
        worst = min(worst, margin)
    if worst < min_margin:
        raise RuntimeError(f"adapter {name!r}: logit margin {worst:.2f} < {min_margin}")
    return worst


def train_all(
    base_dir: Path,
    out_root: Path,
    *,
    tasks: Mapping[str, Sequence[Example]] = TASKS,
    config: TrainConfig = TrainConfig(),  # noqa: B008 - frozen dataclass, safe as a default
) -> dict[str, TrainResult]:
    """Train one adapter per task into `out_root/<task name>`.

    Args:
        base_dir: Folder from `demo.tiny_model.build_base_model`.
        out_root: Parent folder of the adapter folders.
        tasks: Task name → examples (default: `demo.tasks.TASKS`).
        config: Hyper-parameters.

    Returns:
        Task name → result.
    """
    with one_torch_thread():
        return {
            name: train_adapter(base_dir, name, examples, out_root / name, config=config)
            for name, examples in tasks.items()
        }
