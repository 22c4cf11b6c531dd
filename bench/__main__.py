"""Run one benchmark and print its figures as JSON (docs/BENCHMARKS.md has the command of each table).

``voicy [--jobs N --repeats R]``, ``voicy-costs [--repeats R]``, ``voicy-rss [--jobs N]``,
``words``, ``engine [--minutes M --repeats N --batch-sizes 8,16]``, ``cairn [--jobs N]``,
``capacity [--jobs N --side cairn|voicy|both]``, ``chaos ...``,
``voicy-burst [--voices 48 --repeats 3 --lone 6 --device cpu|cuda --model M]`` (then its table)."""

from __future__ import annotations

import argparse
import json
import sys


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
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("suite", choices=["voicy", "voicy-costs", "voicy-rss", "words", "cairn", "engine",
                                            "capacity"])
    parser.add_argument("--jobs", type=int, default=None)
    parser.add_argument("--minutes", type=float, default=5.0, help="engine: length of the recording (minutes)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="voicy: interleaved repeats (3); voicy-costs: rounds (5); engine: runs per engine (5)")
    parser.add_argument("--batch-sizes", default="8", help="engine: batched engines to run, e.g. 8,16")
    parser.add_argument("--cpu-threads", type=int, default=0, help="engine: CPU threads per model (0 = auto)")
    parser.add_argument("--side", choices=["cairn", "voicy", "both"], default="both", help="capacity: which side")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
