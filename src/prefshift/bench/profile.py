"""Where a training variant's CPU time goes: `python -m prefshift.bench.profile`.

Runs our loop (shared-prefix forward, and on two whole sequences per pair), the bare PyTorch
loop and TRL's length-grouped `RewardTrainer` (aligned to fp32 without gradient checkpointing,
and as TRL ships it: bf16 autocast and gradient checkpointing) once each under `torch.profiler`,
on the bench's `small_4x256` workload (`--workload realistic`: the HH-like lengths of
`prefshift.bench.realistic`), each in a fresh process, and writes the top operators by self CPU time
with their shares to `reports/bench_profile.json` and `bench_profile.md` (`_realistic` added to
the names for the realistic workload). Operator shares say what a run spends
its time on and hold up under machine load far better than wall times do; the profiler's own
cost is in the wall times printed here, so take throughput from `prefshift bench`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from prefshift.bench.operators import RANGES, TOP
from prefshift.core.atomic import write_json, write_text


def _data(tok_dir: Path, pairs: int, workload: str):
    """(Workload, items, optimizer steps) of one epoch of the uniform or the realistic workload."""
    from prefshift.bench.common import Workload
    from prefshift.bench.realistic import MAX_LENGTH, realistic_items
    from prefshift.bench.training import _workload

    if workload == "uniform":
        work, items, described = _workload(tok_dir, pairs, 1)
        return work, items, described["optimizer_steps"]
    work = Workload(pairs=pairs, max_length=MAX_LENGTH)
    items = realistic_items(tok_dir, pairs, work.seed)
    items = items[: len(items) - len(items) % work.batch_size]
    return work, items, len(items) // work.batch_size


def _variants(
    tok_dir: Path, model: str, pairs: int, top: int, workload: str = "uniform"
) -> dict[str, Callable[[], dict]]:
    from prefshift.bench.common import isolated
    from prefshift.bench.training import run_bare, run_ours, run_trl

    work, items, steps = _data(tok_dir, pairs, workload)
    return {
        "ours": partial(isolated, run_ours, model, work, tok_dir, items, 1, "shipped", top, label="ours"),
        "ours_two_sequence": partial(
            isolated,
            run_ours,
            model,
            work,
            tok_dir,
            items,
            1,
            "shipped",
            top,
            "fp32",
            "two_sequence",
            label="ours two sequences",
        ),
        "bare_torch_loop": partial(
            isolated, run_bare, model, work, tok_dir, items, 1, "random_batches", top, label="bare"
        ),
        "trl_group_by_length": partial(
            isolated, run_trl, model, work, tok_dir, items, steps, "group_by_length", True, top, label="trl"
        ),
        "trl_group_by_length_as_shipped": partial(
            isolated,
            run_trl,
            model,
            work,
            tok_dir,
            items,
            steps,
            "group_by_length",
            False,
            top,
            label="trl as shipped",
        ),
    }


def profile_training(
    out_dir: Path,
    *,
    model: str = "small_4x256",
    pairs: int = 96,
    top: int = TOP,
    skip: tuple[str, ...] = (),
    workload: str = "uniform",
) -> dict:
    """Profile each variant once; write out_dir/bench_profile{,_realistic}.{json,md}; return the result."""
    from prefshift.bench.common import machine, set_threads, tokenizer_dir, versions

    set_threads(1)
    result: dict = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "versions": versions(),
        "model": model,
        "pairs": pairs,
        "workload": workload,
        "variants": {},
    }
    with tempfile.TemporaryDirectory(prefix="prefshift-profile-") as tmp:
        tok = tokenizer_dir(Path(tmp), 600)
        stem = "bench_profile" if workload == "uniform" else "bench_profile_realistic"
        for name, run in _variants(tok, model, pairs, top, workload).items():
            if name in skip:
                continue
            print(f"profiling {name} ...", flush=True)
            out = run()
            result["variants"][name] = {
                k: out[k] for k in ("wall_s", "work", "side_work", "settings", "profile")
            }
            # Written after every variant: TRL as shipped can take minutes without native bf16.
            write_json(out_dir / f"{stem}.json", result)
            write_text(out_dir / f"{stem}.md", render(result))
    return result


def render(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Training profile, {result['model']}, {result['pairs']} pairs, one epoch,"
        f" {result.get('workload', 'uniform')} lengths",
        "",
        f"{result['date']} on {m['cpu']} ({m['cores']} cores), 1 torch thread, load average at start"
        f" {m['load_avg_1_5_15']}. Regenerate: `python -m prefshift.bench.profile`.",
        "Top operators by self CPU time (share of the run's self CPU time, calls). Wall times include"
        " the profiler's cost.",
        "",
    ]
    for name, entry in result["variants"].items():
        prof, settings = entry["profile"], entry["settings"]
        spans = ", ".join(
            f"{label} {prof['spans_s'][label]:.2f} s ({100 * prof['span_shares'][label]:.1f}%)"
            for label in RANGES
        )
        lines += [
            f"## {name}",
            "",
            f"Wall {entry['wall_s']:.2f} s; {settings['precision']},"
            f" attention {settings['attn_implementation']},"
            f" gradient checkpointing {'on' if settings['gradient_checkpointing'] else 'off'},"
            f" optimizer {settings['optimizer']['kernel'] if settings['optimizer'] else 'none'};"
            f" {entry['work']['real_tokens']} real of {entry['work']['computed_tokens']} computed tokens"
            f" in training, {entry['side_work']['real_tokens']} real tokens in"
            f" {entry['side_work']['no_grad_forwards']} no-grad forwards. Spans: {spans}.",
            "",
            "| operator | self CPU s | share | calls |",
            "|---|---|---|---|",
            *(
                f"| `{op['name']}` | {op['self_cpu_s']:.3f} | {100 * op['share']:.1f}% | {op['calls']} |"
                for op in prof["operators"]
            ),
            "",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m prefshift.bench.profile", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("reports"))
    parser.add_argument("--model", default="small_4x256")
    parser.add_argument("--pairs", type=int, default=96)
    parser.add_argument("--top", type=int, default=TOP)
    parser.add_argument("--skip", action="append", default=[], help="A variant not to profile (repeatable).")
    parser.add_argument("--workload", choices=("uniform", "realistic"), default="uniform")
    args = parser.parse_args(argv)
    profile_training(
        args.out,
        model=args.model,
        pairs=args.pairs,
        top=args.top,
        skip=tuple(args.skip),
        workload=args.workload,
    )
    print(f"wrote the profile of the {args.workload} workload into {args.out}")


if __name__ == "__main__":
    main()
