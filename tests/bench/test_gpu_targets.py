"""Issue 20's targets judged on a bench gpu run's figures: the default paths per device, met or not."""

from __future__ import annotations

from bench.gpu import ONE, SEQUENTIAL
from bench.gpu_targets import default_paths, judge, table
from workers.transcribe.settings import CUDA_CLIP_BATCH, DEFAULT_BATCH_SIZE


def _burst(vs_one: float, wer: float, cpu_per_voice: float) -> dict[str, object]:
    return {"vs_one_at_a_time": vs_one, "wer_pct": wer, "cpu_s_per_voice": cpu_per_voice}


def _figures(device: str, burst: dict, passes: dict, long: dict) -> dict[str, object]:
    return {"device": device, "burst": burst, "one_pass": passes, "long": long}


def _cuda_run(mine: dict, passes: dict, long_vs: float, long_wer: float) -> dict[str, object]:
    """A CUDA run: the default clip batch ``mine`` against one at a time (WER 9.48 %), and the default
    long engine against the sequential one (WER 5.5 %)."""
    burst_name, long_name = default_paths("cuda")
    return _figures("cuda", {ONE: _burst(1.0, 9.48, 2.17), burst_name: mine}, passes,
                    {SEQUENTIAL: {"vs_sequential": 1.0, "wer_pct": 5.5},
                     long_name: {"vs_sequential": long_vs, "wer_pct": long_wer}})


def test_the_default_paths_are_the_fleets_own_per_device() -> None:
    assert default_paths("cuda") == (f"engine, clip batch {CUDA_CLIP_BATCH}",
                                     f"batched engine, batch {DEFAULT_BATCH_SIZE}, text tokens")
    assert default_paths("cpu") == (ONE, f"batched engine, batch {DEFAULT_BATCH_SIZE}, timestamp tokens")


def test_the_issues_own_gpu_run_misses_every_target_it_set() -> None:
    """The H200 figures issue 20 was filed with: clip batch 16 at 0.81×, a pass of 48 at 36 s against 0.98 s
    for 4, 30 CPU-s for 48 voices, the batched long engine at 0.88×."""
    verdicts = judge(_cuda_run(_burst(0.81, 9.36, 0.625), {"4": {"per_clip_s": 0.245}, "48": {"per_clip_s": 0.738}},
                               0.88, 3.8))
    assert [v.met for v in verdicts] == [False, True, False, False, False]
    assert verdicts[3].measured == "3.01×"
    rendered = table(verdicts, "cuda")
    assert rendered.count("**no**") == 4 and "| 0.81× |" in rendered


def test_a_run_that_meets_them_says_so_and_what_it_did_not_run_is_not_counted_as_met() -> None:
    verdicts = judge(_cuda_run(_burst(2.7, 9.9, 0.3), {"4": {"per_clip_s": 0.1}, "16": {"per_clip_s": 0.1}}, 1.4, 5.5))
    assert [v.met for v in verdicts] == [True, True, True, None, True]
    assert "needs 4 and 48" in verdicts[3].measured and "| not measured |" in table(verdicts, "cuda")
    cpu = judge(_figures("cpu", {ONE: _burst(1.0, 7.4, 1.2)}, {}, {SEQUENTIAL: {"vs_sequential": 1.0}}))
    assert [v.met for v in cpu] == [False, True, False, None, None]  # one at a time is the CPU default
    assert table(cpu, "cpu").startswith("(the targets are set for a GPU; on cpu")
