"""`python -m prefshift.bench`: the same as `prefshift bench`."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m prefshift.bench", description=__doc__)
    parser.add_argument(
        "--out", type=Path, default=Path("reports"), help="Directory for bench.json/bench.md."
    )
    parser.add_argument("--quick", action="store_true", help="Tiny sizes, one repetition (smoke test).")
    parser.add_argument("--reps", type=int, default=None, help="Timed repetitions (default 3, quick 1).")
    parser.add_argument("--pipeline", action="store_true", help="Also time a full and a no-op dvc repro.")
    parser.add_argument("--keep", action="store_true", help="Keep the --pipeline clone and print its path.")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per run.")
    parser.add_argument(
        "--stage-threads", type=int, default=None, help="torch threads per pipeline stage (torch's default)."
    )
    parser.add_argument("--note", default=None, help="A line for the report (e.g. machine load).")
    parser.add_argument(
        "--invocations", type=int, default=1, help="Run the bench this many times, one process each; merge."
    )
    parser.add_argument(
        "--trl-as-shipped",
        action="store_true",
        help="Also time TRL with its own defaults (bf16 autocast, gradient checkpointing).",
    )
    parser.add_argument(
        "--first-round",
        type=int,
        default=0,
        help="Number the timed rounds from here (set by --invocations; decides the variants' order).",
    )
    parser.add_argument("--readme", type=Path, default=None, help="Rewrite this README's numbers block.")
    parser.add_argument(
        "--model-dir", type=Path, default=None, help="Training and ANCHOR rows on this local HF model."
    )
    parser.add_argument(
        "--pairs", type=Path, default=None, help="HH-style .jsonl(.gz) pairs for --model-dir."
    )
    parser.add_argument("--max-length", type=int, default=None, help="Token cut for --model-dir (192).")
    args = parser.parse_args(argv)
    from prefshift.bench.run import run_bench

    run_bench(
        args.out,
        quick=args.quick,
        reps=args.reps,
        pipeline=args.pipeline,
        keep=args.keep,
        threads=args.threads,
        stage_threads=args.stage_threads,
        note=args.note,
        invocations=args.invocations,
        trl_as_shipped=args.trl_as_shipped,
        readme=args.readme,
        first_round=args.first_round,
        model_dir=args.model_dir,
        pairs=args.pairs,
        max_length=args.max_length,
    )


if __name__ == "__main__":
    main()
