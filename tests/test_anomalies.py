"""`hbmsim anomalies`: every trial finishes (programs whose blocks do not fit are skipped and
counted), and a bigger GPU predicted slower is a scheduling anomaly, not a model error."""
import dataclasses
import json

import pytest

from hbmsim.algorithms.workload import Workload
from hbmsim.scenarios.anomalies import fitting_build, measure, programs
from hbmsim.scenarios.cli import main
from hbmsim.simulator import HbmsimError, simulate
from hbmsim.simulator.timeline import Timeline


@pytest.mark.parametrize("trials, seed", [(7, 1), (2, 2)])
def test_blocks_that_do_not_fit_are_skipped_and_counted(a100, trials, seed):
    # seed 1's 7th trial draws flash1 blocks 128 x 64 at head dim 128, seed 2's 2nd 128 x 64: their
    # backward needs more SRAM than an A100 SM has (the default run used to stop there, rc 2)
    r = measure(a100, trials=trials, seed=seed, progress=False)
    assert r["skipped"] == 1 and list(r["skipped_why"]) == ["flash1 training"]
    assert "bytes of SRAM, more than sram_bytes_per_sm = 166912" in r["skipped_why"]["flash1 training"]
    # two changes per program and trial that ran
    assert r["changes"] == 2 * (trials * len(programs(16, 16)) - r["skipped"])


def test_the_command_finishes_and_reports_the_skipped(capsys):
    assert main(["anomalies", "--trials", "2", "--seed", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"] == 1 and out["trials"] == 2


def test_a_block_too_big_is_caught_before_simulating(a100):
    spec, mapping, training = programs(128, 128)["flash1 training"]
    with pytest.raises(HbmsimError, match="flash1_bwd: a block needs"):
        fitting_build(spec, mapping, training, a100, Workload(1, 1, 256, 256, 128))


# A trial of seed 4: flash2 forward, causal, 5 SMs without L2, 64 x 64 blocks (5 query blocks a
# head, 90 blocks, 2 resident per SM). With 1.5x the bandwidth it is predicted 2.4% slower. (Seed
# 1's case, 22 SMs and 16-row blocks, went when a partial last query block came to compute its
# kernel's whole tile, q_tile_rows.)
CASE = Workload(3, 6, 299, 192, 32, causal=True)


def tail(gpu, build) -> tuple:
    """(result, {block: SM}) of the run."""
    tl = Timeline(max_blocks=10 ** 6)
    r = simulate(gpu, build(), recorder=tl)
    return r, {e["args"]["block"]: e["tid"] for e in tl.events if e["cat"] == "block"}


def test_more_bandwidth_slower_is_a_scheduling_anomaly(a100):
    gpu = dataclasses.replace(a100, l2_bytes=0, l2_bytes_per_s=0.0).with_sms(5)
    spec, mapping, training = programs(64, 64)["flash2"]
    build = fitting_build(spec, mapping, training, gpu, CASE)
    faster = dataclasses.replace(gpu, hbm_bytes_per_s=1.5 * gpu.hbm_bytes_per_s)
    r0, sm0 = tail(gpu, build)
    r1, sm1 = tail(faster, build)
    assert r1.time_s / r0.time_s - 1 == pytest.approx(0.0236, abs=5e-4)
    # the same bytes from HBM and L2 and the same compute: nothing costs more
    for what in ("hbm_read", "hbm_write", "read"):
        assert r1.total(what) == r0.total(what)
    assert sum(k.matmul_flops for k in r1.kernels) == sum(k.matmul_flops for k in r0.kernels)
    # the last head's last two query blocks see every key (the longest blocks): the base GPU runs
    # them on two SMs; with faster loads two slots of one SM free together and both land there,
    # sharing its pipe
    assert sm0[88] != sm0[89] and sm1[88] == sm1[89]
    # with one block per SM nothing shares a pipe, and more bandwidth is faster at every step
    one = dataclasses.replace(gpu, max_blocks_per_sm=1)
    times = [simulate(dataclasses.replace(one, hbm_bytes_per_s=f * one.hbm_bytes_per_s), build()).time_s
             for f in (1, 1.25, 1.5, 2, 4)]
    assert times == sorted(times, reverse=True) and len(set(times)) == len(times)
