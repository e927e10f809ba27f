"""The fused kernel's thread pool (mxkernel.c): calls split into chunks that the caller and the workers claim from one
atomic word. Whatever the thread counts, the callers, the pauses (workers that went to sleep) and a fork, every call
returns the single-thread result bit for bit, with every row written once."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from accel.formats import mxkernel_build, quantize
from accel.formats.mxkernel import PackedMX
from accel.formats.mxkernel_q8 import matmul_q8

pytestmark = pytest.mark.skipif(mxkernel_build.load_kernel() is None, reason="the fused MX kernel cannot be built")


def _packed(n: int, k: int, seed: int) -> PackedMX:
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    return PackedMX(quantize(w, "mxfp6", axis=1))


def test_calls_from_several_python_threads_match_one_thread():
    """Four Python threads call at once (the kernel serialises them), with 2, 3 and 16 kernel threads (more chunks
    than rows for the small weight), pausing now and then so that the workers sleep and must be woken."""
    weights = [_packed(n, 96, n) for n in (5, 67, 300)]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((s, 96)).astype(np.float32) for s in (1, 3, 4)]
    want = {
        (i, j): (weights[i].matmul(x, threads=1), matmul_q8(weights[i], x, threads=1))
        for i in range(3)
        for j, x in enumerate(xs)
    }
    bad: list[tuple] = []

    def caller(seed: int) -> None:
        r = np.random.default_rng(seed)
        for call in range(60):
            i, j, threads = int(r.integers(3)), int(r.integers(3)), int(r.choice([2, 3, 16]))
            y = weights[i].matmul(xs[j], threads=threads)
            y8 = matmul_q8(weights[i], xs[j], threads=threads)
            if not (np.array_equal(y, want[i, j][0]) and np.array_equal(y8, want[i, j][1])):
                bad.append((seed, call, i, j, threads))
            if call % 15 == 14:
                time.sleep(0.003)  # longer than the workers spin: they sleep on the condition variable

    callers = [threading.Thread(target=caller, args=(seed,)) for seed in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in callers), "a kernel call hung"
    assert bad == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_starts_its_own_pool():
    """The parent's workers do not exist in the child: its first call must start new ones, not wait for them."""
    p = _packed(200, 64, 1)
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    want = p.matmul(x, threads=2)  # the parent's pool is running
    pid = os.fork()
    if pid == 0:  # child: exit 0 only if the pooled call returns the parent's numbers
        ok = False
        try:
            ok = bool(np.array_equal(p.matmul(x, threads=2), want) and np.array_equal(p.matmul(x, threads=3), want))
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's kernel call hung")
