"""Warp roles (BlockContext.fork / event) and the SM's two pipes (time_model.py: sm_pipes,
pipe_sharing), on the tiny machine of conftest.tiny_gpu: per SM 1e12 tensor FLOP/s and 5e10 FP32
operations/s (an FMA counted as 2 FLOPs), no host model, times worked out by hand.

Two consumer roles each do a GEMM of 1e6 FLOPs (1 us on the tensor pipe) and then its softmax,
1e4 operations (0.2 us on the vector pipe):
- wgmma (asynchronous), two pipes shared by the roles in flight (pipe_sharing, the default):
  both GEMMs share the tensor pipe, 0-2 us, then both softmaxes the vector pipe, 2-2.4 us.
- the same, but role B issues its GEMM after role A's has been served (FA3's ping-pong: the
  scheduler barrier, then the tensor cores' issue order): A's GEMM 0-1 us, its softmax 1-1.2 us
  under B's GEMM 1-2 us; B's softmax 2-2.2 us: the block ends at 2.2 us.
- two FIFO pipes (pipe_sharing off): A's GEMM 0-1 us, B's 1-2 us (first come, first served), A's
  softmax under it: 2.2 us without any barrier.
- mma.sync, or sm_pipes off: one pipe, 2 x (1 + 0.2) = 2.4 us.
- xu_tensor_serial (the default; measured on Hopper: the tensor pipe and the special-function unit
  do not work at once): one pipe for wgmma too, 2.4 us however the roles hand over. The tests of
  the two pipes above switch it off (MODEL).
"""
import pytest

from hbmsim.simulator import Launch, Program, TimeModel, simulate
from hbmsim.simulator.time_model import MMA_SYNC, WGMMA

from conftest import tiny_gpu

MODEL = TimeModel().off("host", "xu_tensor_serial")      # the two pipes, as sm_pipes draws them
GEMM = dict(matmul_flops=1_000_000)          # 1e6 / 1e12 = 1 us on the tensor pipe
SOFTMAX = dict(vector_flops=10_000)          # 1e4 / 5e10 = 0.2 us on the vector pipe


def two_consumers(tensor_op: str) -> Program:
    def consumer(ctx):
        yield from ctx.compute(**GEMM, **SOFTMAX)

    def block(ctx, _):
        a, b = ctx.fork(consumer(ctx)), ctx.fork(consumer(ctx))
        yield a
        yield b
    return Program("roles", [Launch("k", 1, 0, block, tensor_op=tensor_op)])


def handed_over(tensor_op: str) -> Program:
    """Role B issues its GEMM once role A's has been served (flash3.py's ping-pong hand-over)."""
    def block(ctx, _):
        turn = ctx.event()

        def a():
            gemm = ctx.compute(**GEMM)
            yield from gemm
            turn.succeed()
            yield from ctx.compute(**SOFTMAX)

        def b():
            yield turn
            yield from ctx.compute(**GEMM, **SOFTMAX)
        ra, rb = ctx.fork(a()), ctx.fork(b())
        yield ra
        yield rb
    return Program("ping-pong", [Launch("k", 1, 0, block, tensor_op=tensor_op)])


def test_unsynchronised_roles_share_the_pipes():
    assert simulate(tiny_gpu(), two_consumers(WGMMA), model=MODEL).time_s == pytest.approx(2.4e-6, rel=1e-9)


def test_a_handed_over_gemm_overlaps_one_roles_softmax_with_the_others_gemm():
    assert simulate(tiny_gpu(), handed_over(WGMMA), model=MODEL).time_s == pytest.approx(2.2e-6, rel=1e-9)


def test_fifo_pipes_overlap_without_a_barrier():
    fifo = MODEL.off("pipe_sharing")
    assert simulate(tiny_gpu(), two_consumers(WGMMA), model=fifo).time_s == pytest.approx(2.2e-6, rel=1e-9)
    assert simulate(tiny_gpu(), handed_over(WGMMA), model=fifo).time_s == pytest.approx(2.2e-6, rel=1e-9)


def test_mma_sync_and_sm_pipes_off_add_up():
    assert simulate(tiny_gpu(), two_consumers(MMA_SYNC), model=MODEL).time_s == pytest.approx(2.4e-6, rel=1e-9)
    off = MODEL.off("sm_pipes")
    assert simulate(tiny_gpu(), two_consumers(WGMMA), model=off).time_s == pytest.approx(2.4e-6, rel=1e-9)


def test_measured_hopper_sms_run_a_softmax_after_any_gemm():
    """xu_tensor_serial on (TimeModel's default): the ping-pong hand-over hides nothing."""
    serial = TimeModel().off("host")
    for program in (two_consumers(WGMMA), handed_over(WGMMA)):
        assert simulate(tiny_gpu(), program, model=serial).time_s == pytest.approx(2.4e-6, rel=1e-9)


def test_a_role_waits_at_an_event_until_another_releases_it():
    """A producer role signals `full` after 0.5 us of vector work; the consumer's GEMM (1 us)
    starts only then: the block ends at 1.5 us, and the GEMM's FLOPs are counted once."""
    def block(ctx, _):
        full = ctx.event()

        def producer():
            yield from ctx.compute(vector_flops=25_000)      # 2.5e4 / 5e10 = 0.5 us
            full.succeed()

        def consumer():
            yield full
            yield from ctx.compute(**GEMM)

        p, c = ctx.fork(producer()), ctx.fork(consumer())
        yield p
        yield c
    r = simulate(tiny_gpu(), Program("barrier", [Launch("k", 1, 0, block, tensor_op=WGMMA)]), model=MODEL)
    assert r.time_s == pytest.approx(1.5e-6, rel=1e-9)
    assert r.kernels[0].matmul_flops == 1_000_000 and r.kernels[0].vector_flops == 25_000


def test_the_timeline_draws_each_named_role_on_its_own_track():
    """Two named consumers on SM 0: each role's compute lands on its own track, drawn from when it
    entered its pipe: both GEMMs share the tensor pipe (0-2 us), then both softmaxes the vector
    pipe (2-2.4 us); with FIFO pipes consumer 1's GEMM (1-2 us) runs while consumer 0's softmax
    (1-1.2 us) does."""
    from hbmsim.simulator.timeline import ROLE_TID_BASE, Timeline

    def block(ctx, _):
        def consumer():
            yield from ctx.compute(**GEMM)
            yield from ctx.compute(**SOFTMAX)
        a, b = ctx.fork(consumer(), "consumer 0"), ctx.fork(consumer(), "consumer 1")
        yield a
        yield b

    def spans(model) -> tuple:
        t = Timeline()
        simulate(tiny_gpu(), Program("roles", [Launch("k", 1, 0, block, tensor_op=WGMMA)]), model=model, recorder=t)
        assert t.roles == {(0, "consumer 0"): ROLE_TID_BASE, (0, "consumer 1"): ROLE_TID_BASE + 1}
        return tuple(sorted((e["ts"], e["ts"] + e["dur"]) for e in t.events
                            if e.get("cat") == "compute" and e["tid"] == tid) for tid in t.roles.values())
    (gemm0, soft0), (gemm1, soft1) = spans(MODEL)
    assert gemm0 == gemm1 == pytest.approx((0.0, 2.0)) and soft0 == soft1 == pytest.approx((2.0, 2.4))
    (gemm0, soft0), (gemm1, soft1) = spans(MODEL.off("pipe_sharing"))
    assert gemm0 == pytest.approx((0.0, 1.0)) and soft0 == pytest.approx((1.0, 1.2))
    assert gemm1 == pytest.approx((1.0, 2.0)) and soft1 == pytest.approx((2.0, 2.2))


def test_fp8_wgmma_overlaps_as_fp16_wgmma_does():
    """The FP8 warpgroup MMA is as asynchronous as the fp16 one: the same two consumers overlap
    (tiny GPU without an FP8 rate: the fp16 peak, so the same 2.2 us when handed over)."""
    from hbmsim.simulator.time_model import WGMMA_FP8
    assert simulate(tiny_gpu(), handed_over(WGMMA_FP8), model=MODEL).time_s == pytest.approx(2.2e-6, rel=1e-9)


def barrier_rounds() -> Program:
    """Two roles meet at a named barrier twice (ctx.barrier, reused): A waits 100 ns, meets B, waits
    300 ns; B waits 300 ns, meets A, waits 100 ns (ctx.chain: 1 cycle an instruction at 1 GHz, no pipe).
    With the barrier: the first meeting at 300 ns, A's second round starts at 600 and B's at 400, the
    second meeting at 700, A ends at 1,000 ns. Without it each role runs its 800 ns alone."""
    def block(ctx, _):
        meet = ctx.barrier(2)

        def role(before: int, after: int):
            for _ in range(2):
                yield from ctx.chain(before)
                yield from meet.sync()
                yield from ctx.chain(after)
        ra, rb = ctx.fork(role(100, 300)), ctx.fork(role(300, 100))
        yield ra
        yield rb
    return Program("barrier", [Launch("k", 1, 0, block, tensor_op=WGMMA)])


def test_a_named_barrier_holds_each_role_until_all_have_reached_it_every_round():
    gpu = tiny_gpu(dependent_issue_cycles=1)
    assert simulate(gpu, barrier_rounds(), model=MODEL).time_s == pytest.approx(1000e-9, rel=1e-9)
    unsynchronised = MODEL.off("named_barriers")
    assert simulate(gpu, barrier_rounds(), model=unsynchronised).time_s == pytest.approx(800e-9, rel=1e-9)
