"""The machine on its own: fair-share HBM, FIFO pipes, L2, dispatch, occupancy, launch errors."""
import numpy as np
import pytest
import simpy

from hbmsim.simulator import HbmsimError, Launch, Program, Tensor, simulate
from hbmsim.simulator.resources import FifoPipe, SharedPool

from conftest import tiny_gpu


def finish_times(pool_cls, requests, rate=100.0, latency=0.0):
    """requests: [(issue_time_s, amount)] -> finish times."""
    env = simpy.Environment()
    pool = pool_cls(env, rate, latency)
    out = {}

    def client(i, at, amount):
        yield env.timeout(at)
        if isinstance(pool, FifoPipe):
            yield env.timeout(pool.reserve(amount) - env.now)
        else:
            yield pool.request(amount)
        out[i] = env.now
    for i, (at, amount) in enumerate(requests):
        env.process(client(i, at, amount))
    env.run()
    return [out[i] for i in range(len(requests))], pool


def test_shared_pool_splits_bandwidth_fairly():
    t, pool = finish_times(SharedPool, [(0, 100), (0, 100)])
    assert t == pytest.approx([2.0, 2.0])
    t, _ = finish_times(SharedPool, [(0, 100), (0, 200)])
    assert t == pytest.approx([2.0, 3.0])        # shared until the small one ends, then alone
    # A alone for 0.5 s (50 served), then both at 50/s: A ends at 1.5, B (50 left) alone at 2.0
    t, pool = finish_times(SharedPool, [(0, 100), (0.5, 100)])
    assert t == pytest.approx([1.5, 2.0])
    assert pool.busy_s == pytest.approx(2.0) and pool.served == 200


def test_shared_pool_latency_is_added_once_and_overlaps():
    t, pool = finish_times(SharedPool, [(0, 100), (0, 100)], latency=0.25)
    assert t == pytest.approx([2.25, 2.25])
    assert pool.busy_s == pytest.approx(2.0)


def test_fifo_pipe_serves_in_order():
    t, pipe = finish_times(FifoPipe, [(0, 100), (0, 100), (3, 50)])
    assert t == pytest.approx([1.0, 2.0, 3.5])
    assert pipe.busy_s == pytest.approx(2.5)


def test_l2_lru_write_back(gpu):
    """The L2's policy (l2.py) on one block's accesses to 1-byte tensors, in a 100-byte L2."""
    a, b, c, d, e = (Tensor(name, (1, 1, n), "bool", count_only=True)
                     for name, n in (("A", 60), ("B", 30), ("C", 40), ("D", 50), ("E", 500)))
    row = slice(0, 1)

    def block(ctx, i):
        yield from ctx.store(a[0], row, slice(0, 60))       # miss: allocates a dirty line, nothing evicted
        yield from ctx.load(b[0], row, slice(0, 30))        # miss: read from HBM (90 B used)
        yield from ctx.load(a[0], row, slice(0, 60))        # hit: A is now the most recent
        yield from ctx.load(c[0], row, slice(0, 40))        # miss: evicts B (least recent, clean), not A
        yield from ctx.load(b[0], row, slice(0, 30))        # miss again: evicts dirty A, written back
        yield from ctx.store(e[0], row, slice(0, 500))      # larger than the L2: straight to HBM
        yield from ctx.load(c[0], row, slice(0, 40))        # hit
        yield from ctx.load(d[0], row, slice(0, 50))        # miss: evicts B (C was used since)
    r = simulate(tiny_gpu(l2_bytes=100, l2_bytes_per_s=1e12),
                 Program("lru", [Launch("lru", 1, 0, block)], inputs=(a, b, c, d, e)))
    k = r.kernels[0]
    assert {n: (t.read, t.write, t.hbm_read, t.hbm_write) for n, t in k.tensors.items()} == {
        "A": (60, 60, 0, 60), "B": (60, 0, 60, 0), "C": (80, 0, 40, 0), "D": (50, 0, 50, 0), "E": (0, 500, 0, 500)}
    assert [kk.name for kk in r.kernels] == ["lru"]          # nothing dirty left for the end-of-program flush


def copy_program(n_blocks, tile_bytes_rows, sram_bytes=0, cols=4):
    """Each block copies rows of X (fp32) to Y: a pure memory program."""
    x = Tensor("X", (1, n_blocks * tile_bytes_rows, cols), "fp32", count_only=True)
    y = Tensor("Y", (1, n_blocks * tile_bytes_rows, cols), "fp32", count_only=True)

    def block(ctx, i):
        rows = slice(i * tile_bytes_rows, (i + 1) * tile_bytes_rows)
        yield from ctx.load(x[0], rows, slice(0, cols))
        yield from ctx.store(y[0], rows, slice(0, cols))
    return Program("copy", [Launch("copy", n_blocks, sram_bytes, block, allocs=(y,))], inputs=(x,))


def test_block_too_big_for_sram_is_a_launch_error_with_the_numbers(gpu):
    with pytest.raises(HbmsimError, match=r"kernel copy: a block needs 70000 bytes of SRAM, more than "
                                          r"sram_bytes_per_sm = 65536 on tiny"):
        simulate(gpu, copy_program(4, 8, sram_bytes=70000))


def test_occupancy_is_bounded_by_sram_and_block_limit(gpu):
    r = simulate(gpu, copy_program(64, 8, sram_bytes=20000))
    assert r.kernels[0].blocks_per_sm == 3                  # 65536 // 20000
    assert r.sram_peak_bytes == 60000
    r = simulate(gpu, copy_program(64, 8, sram_bytes=0))
    assert r.kernels[0].blocks_per_sm == 8                  # max_blocks_per_sm


def test_blocks_dispatch_round_robin_then_as_slots_free(gpu):
    seen = []
    simulate(tiny_gpu(max_blocks_per_sm=1), copy_program(6, 8),
             trace=lambda t, sm, k, b, what: seen.append((b, sm)) if what.startswith("load") else None)
    assert seen[:4] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert sorted(b for b, _ in seen) == list(range(6))


def test_memory_program_time_is_bytes_over_bandwidth_plus_latency(gpu):
    # 4 blocks on 4 SMs each load then store 8 rows x 4 fp32 = 128 B: 512 B in each phase shared
    # fairly -> each phase takes 512 B / 1e11 B/s + 1e-7 s latency.
    r = simulate(gpu, copy_program(4, 8))
    assert r.time_s == pytest.approx(2 * (512 / 1e11 + 1e-7))
    assert r.cycles == round(r.time_s * 1e9)
    assert r.bound() == "memory"
    assert r.total("hbm_read") == 512 and r.total("hbm_write") == 512


def test_hbm_footprint_and_capacity():
    prog = copy_program(4, 8)
    r = simulate(tiny_gpu(), prog)
    assert r.hbm_peak_bytes == 2 * 4 * 8 * 4 * 4
    with pytest.raises(HbmsimError, match=r"HBM footprint 1024 bytes exceeds hbm_capacity_bytes = 1000 on tiny"):
        simulate(tiny_gpu(hbm_capacity_bytes=1000), copy_program(4, 8))


def test_l2_hits_cut_hbm_reads_but_not_global_reads():
    x = Tensor("X", (1, 8, 8), "fp32", np.arange(64.0).reshape(1, 8, 8))

    def block(ctx, i):           # every block reads the same tile: one miss, then hits
        t = yield from ctx.load(x[0], slice(0, 8), slice(0, 8))
        assert t[1, 2] == 10.0
    prog = Program("reuse", [Launch("reuse", 10, 0, block)], inputs=(x,))
    r = simulate(tiny_gpu(l2_bytes=4096, l2_bytes_per_s=1e12), prog)
    assert r.total("read") == 10 * 256
    assert r.total("hbm_read") == 256
    r0 = simulate(tiny_gpu(), prog)
    assert r0.total("hbm_read") == 10 * 256


def test_dirty_l2_lines_are_written_back_at_the_end():
    r = simulate(tiny_gpu(l2_bytes=1 << 20, l2_bytes_per_s=1e12), copy_program(4, 8))
    assert r.kernels[-1].name == "l2_writeback"
    assert r.total("hbm_write") == 512 and r.total("write") == 512


def test_store_shape_mismatch_is_an_error(gpu):
    y = Tensor("Y", (1, 4, 4), "fp32")

    def block(ctx, i):
        yield from ctx.store(y[0], slice(0, 2), slice(0, 4), np.zeros((3, 4)))
    with pytest.raises(HbmsimError, match=r"store to Y: value shape \(3, 4\) disagrees with tile \(2, 4\)"):
        simulate(gpu, Program("bad", [Launch("bad", 1, 0, block)]))


def test_l2_sees_reuse_across_standard_attention_kernels():
    # S and P (1 x 256 x 256 fp16 = 128 KiB each) fit in a 1 MiB L2: after gemm_qk writes S, the
    # scale / softmax / gemm_pv kernels read S and P from L2, so no DRAM read of S or P happens;
    # the final write-back stores each exactly once.
    from hbmsim.algorithms.standard import standard_forward
    from hbmsim.algorithms.workload import Workload
    r = simulate(tiny_gpu(l2_bytes=1 << 20, l2_bytes_per_s=1e12), standard_forward(Workload(1, 1, 256, 256, 64)))
    t = r.tensors()
    assert t["S"].read == 2 * 131072 and t["S"].hbm_read == 0
    assert t["P"].read == 131072 and t["P"].hbm_read == 0
    assert t["S"].hbm_write == 131072 and t["P"].hbm_write == 131072
    assert t["Q"].hbm_read == t["K"].hbm_read == t["V"].hbm_read == 256 * 64 * 2   # compulsory only


def test_the_machines_context_offers_the_whole_block_context():
    """program.BlockContext is the interface a program is written against; the engine's context
    (context.py) must offer each of its calls with the same parameters."""
    import inspect

    from hbmsim.simulator import BlockContext
    from hbmsim.simulator.context import MachineContext
    calls = [n for n, f in vars(BlockContext).items() if callable(f) and not n.startswith("_")]
    assert {"load", "load_tiles", "prefetch", "wait", "store", "store_tiles", "atomic_add", "compute",
            "compute_chain", "note"} <= set(calls)
    for name in calls:
        assert inspect.signature(getattr(MachineContext, name)) == inspect.signature(getattr(BlockContext, name)), name
    assert {"sm", "block"} <= set(MachineContext.__slots__)
