"""The study's one sizing pilot: the weak teacher and the gold ceiling only, never a method.

Trains MiniLM-L6 cut to `--weak-layers` layers (the teacher) and MiniLM-L6 whole (the gold
ceiling) with Bradley-Terry on gold labels, and prints each one's ID accuracy after every epoch
(one run per epoch count, each with its own schedule, as the study trains), the wall time and the
truncation share, as JSON lines. No student and no OOD target is ever scored, so choosing the
study's sizes from it cannot look at a method's OOD result.

    python configs/real-helpful/pilot.py --source hh_helpful=/work/data-cache/hh-rlhf/helpful-base \
        --strong /work/data-cache/models/all-minilm-l6-v2 --out pilot.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from prefshift.config.params import EncodeConfig, LMSpec, Params, TrainConfig
from prefshift.data.adapters import get_adapter
from prefshift.data.encode import Encoder, TruncationCount
from prefshift.data.schema import SkipCounter
from prefshift.data.splits import seeded_order
from prefshift.engine.scoring import score_pairs
from prefshift.engine.train import seed_everything, train_reward_model
from prefshift.methods.base import Objective
from prefshift.models.backbone import resolve_pretrained
from prefshift.models.reward import load_reward_model


def accuracy(frame) -> float:
    return float(((frame["delta"] > 0) + 0.5 * (frame["delta"] == 0)).mean() * 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="NAME=PATH: a built-in adapter and its local copy")
    parser.add_argument("--split", default="train", help="the source split the pilot's pairs come from")
    parser.add_argument("--strong", required=True)
    parser.add_argument("--weak-layers", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=600, help="gold pairs each model trains on")
    parser.add_argument("--test", type=int, default=400)
    parser.add_argument("--max-length", type=int, default=192)
    parser.add_argument("--epochs", default="1,2,3")
    parser.add_argument("--lr", default="teacher=1e-4,ceiling=1e-4")
    parser.add_argument("--only", default="teacher,ceiling")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    name, path = args.source.split("=", 1)
    params = Params.model_validate(
        {"data": {"sources": {name: {"path": path}}}, "encode": {"max_length": args.max_length}}
    )
    pairs = seeded_order(get_adapter(name, params).load_pairs(args.split, params, SkipCounter()), 0)
    train = {"teacher": pairs[: args.pairs], "ceiling": pairs[args.pairs : 2 * args.pairs]}
    test = pairs[2 * args.pairs : 2 * args.pairs + args.test]
    weak_dir = Path(args.strong + f"-cut{args.weak_layers}")
    if not weak_dir.exists():
        resolve_pretrained(LMSpec(name_or_path=args.strong, keep_layers=args.weak_layers), weak_dir)
    base = {"teacher": weak_dir, "ceiling": Path(args.strong)}
    lrs = dict(item.split("=") for item in args.lr.split(","))
    with Path(args.out).open("a", encoding="utf-8") as out:
        for which in args.only.split(","):
            for epochs in [int(e) for e in args.epochs.split(",")]:
                seed_everything(0)
                model, tokenizer = load_reward_model(base[which], seed=0)
                truncation = TruncationCount()
                encoder = Encoder(tokenizer, EncodeConfig(max_length=args.max_length))
                items = encoder.encode_pairs(train[which], truncation=truncation)
                cfg = TrainConfig(
                    batch_size=16,
                    epochs=epochs,
                    lr=float(lrs[which]),
                    precision="fp32",
                    checkpoint_every=0,
                    drift_every=10**6,
                    log_every=10,
                )
                started = time.perf_counter()
                model, log = train_reward_model(
                    model, tokenizer, items, Objective(which), cfg, seed=0, name=which, progress=False
                )
                train_s = time.perf_counter() - started
                model.eval()
                frame = score_pairs(model, tokenizer, test, params)
                row = {
                    "model": which,
                    "layers": model.num_layers,
                    "epochs": epochs,
                    "lr": float(lrs[which]),
                    "pairs": len(items),
                    "id_test": len(frame),
                    "id_acc": accuracy(frame),
                    "final_loss": log["steps"][-1].get("loss") if log["steps"] else None,
                    "train_s": round(train_s, 1),
                    "score_s": round(time.perf_counter() - started - train_s, 1),
                    "train_truncation": truncation.as_dict()["share"],
                    "test_truncation": frame.attrs["truncation"]["share"],
                }
                print(json.dumps(row), file=sys.stderr, flush=True)
                out.write(json.dumps(row) + "\n")
                out.flush()


if __name__ == "__main__":
    main()
