"""Issue 20's targets judged on one ``bench gpu`` run: each target, what the run measured, met or not."""

from __future__ import annotations

from dataclasses import dataclass

from bench.gpu import ONE, SEQUENTIAL, clip_batch_path, long_path
from workers.transcribe.settings import DEFAULT_BATCH_SIZE, EngineSettings

# Issue 20's targets, set for a GPU (H200, tiny.en float16, the 48-voice burst). On a CPU they are
# judged all the same, for the record: there the fleet's default path is one voice at a time.
BURST_SPEEDUP_MIN = 2.5  # × one at a time, for the fleet's default clip batch on the device
WER_MARGIN_PT = 0.5  # percentage points of WER the default path may lose against one at a time
PASS_GROWTH_MAX = 1.25  # a pass of PASS_LARGE clips costs per clip at most this × a pass of PASS_SMALL
PASS_SMALL, PASS_LARGE = 4, 48  # clips per pass
CPU_S_PER_VOICE_MAX = 0.4  # host CPU-seconds per voice on the default path
LONG_SPEEDUP_MIN = 1.3  # × the sequential engine, for the device's default engine on the long recording


@dataclass(frozen=True)
class Verdict:
    target: str
    measured: str
    met: bool | None  # None: this run did not measure it (the reason is in ``measured``)

    @property
    def mark(self) -> str:
        return {True: "yes", False: "**no**", None: "not measured"}[self.met]


def default_paths(device: str) -> tuple[str, str]:
    """The names ``bench gpu`` gives the fleet's default paths on ``device`` (``cuda``/``cpu``):
    the burst's and the long recording's, as ``EngineSettings`` resolves them with nothing set."""
    settings = EngineSettings()
    clips = settings.clip_batch_on(device)
    burst = ONE if clips <= 1 else clip_batch_path(clips)
    return burst, long_path(DEFAULT_BATCH_SIZE, settings.timestamp_tokens_on(device))


def judge(figures: dict) -> list[Verdict]:
    """Every target against ``figures`` (``bench.gpu.run``'s dict)."""
    burst_name, long_name = default_paths(figures["device"])
    burst, passes, long = figures["burst"], figures["one_pass"], figures["long"]
    out: list[Verdict] = []
    if burst_name in burst:
        mine, one = burst[burst_name], burst[ONE]
        out += [
            Verdict(f"burst: {burst_name} ≥ {BURST_SPEEDUP_MIN}× one at a time", f"{mine['vs_one_at_a_time']}×",
                    mine["vs_one_at_a_time"] >= BURST_SPEEDUP_MIN),
            Verdict(f"burst: its WER within {WER_MARGIN_PT} points of one at a time",
                    f"{mine['wer_pct']} % against {one['wer_pct']} %",
                    mine["wer_pct"] - one["wer_pct"] <= WER_MARGIN_PT),
            Verdict(f"burst: host CPU ≤ {CPU_S_PER_VOICE_MAX} CPU-s per voice", f"{mine['cpu_s_per_voice']} CPU-s",
                    mine["cpu_s_per_voice"] <= CPU_S_PER_VOICE_MAX)]
    else:
        out.append(Verdict(f"burst: {burst_name}", "not run (add its size to --clip-batches)", None))
    small, large = passes.get(str(PASS_SMALL)), passes.get(str(PASS_LARGE))
    growth = f"a pass of {PASS_LARGE} ≤ {PASS_GROWTH_MAX}× per clip of a pass of {PASS_SMALL}"
    if small and large:
        ratio = round(large["per_clip_s"] / small["per_clip_s"], 2)
        out.append(Verdict(growth, f"{ratio}×", ratio <= PASS_GROWTH_MAX))
    else:
        out.append(Verdict(growth, f"not run (--clip-batches needs {PASS_SMALL} and {PASS_LARGE})", None))
    if long_name in long:
        mine, seq = long[long_name], long[SEQUENTIAL]
        out.append(Verdict(f"long recording: {long_name} ≥ {LONG_SPEEDUP_MIN}× sequential, WER no worse",
                           f"{mine['vs_sequential']}×, WER {mine['wer_pct']} % against {seq['wer_pct']} %",
                           mine["vs_sequential"] >= LONG_SPEEDUP_MIN and mine["wer_pct"] <= seq["wer_pct"]))
    else:
        out.append(Verdict(f"long recording: {long_name}", f"not run (--long-batches needs {DEFAULT_BATCH_SIZE})",
                           None))
    return out


def table(verdicts: list[Verdict], device: str) -> str:
    lines = [] if device == "cuda" else [f"(the targets are set for a GPU; on {device} the fleet's default "
                                         "burst path is one voice at a time, judged for the record)", ""]
    lines += ["| issue 20's target | this run | met |", "|---|---|---|"]
    lines += [f"| {v.target} | {v.measured} | {v.mark} |" for v in verdicts]
    return "\n".join(lines)
