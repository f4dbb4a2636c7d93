"""How long the training chunk takes to lower and to compile at given sizes (issue 30), with no
compilation cache: the cost of each size the auto-scale search compiles cold. `seq` compiles
the sizes one after another, `par` all at once on threads (as the search's first two).
    python3 experiments/gpu/compile_time.py seq 16384 -- --config breakout-minatar
    python3 experiments/gpu/compile_time.py par 65536,131072 -- --env CartPole-v1
Where XLA's time goes: run it with TF_CPP_MIN_LOG_LEVEL=0
TF_CPP_VMODULE=gpu_compiler=1,hlo_pass_pipeline=1 and read the "time:" lines of the chunk's
module (jit_per_device): `config-assigner` is the autotuning, `RunBackend` LLVM and ptxas.
The CPU seconds (all threads, the whole process) against the wall time say how parallel it is."""
import concurrent.futures
import resource
import sys
import time

import jax

from jaxrl_mgpu import parallel, rundir
from jaxrl_mgpu import autoscale
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import algos, plan as plan_lib
from jaxrl_mgpu.chunks import Trainer

mode, sizes = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
given = config_lib.parse_given(sys.argv[sys.argv.index("--") + 1:])
cfg, _ = rundir.resolve(config_lib.Config(**given), given)
cfg = config_lib.validate(cfg)
one = parallel.this_device()
jax.numpy.ones(1).block_until_ready()  # the backend is up before the clock starts
start = time.perf_counter()


def cpu_s() -> float:
    """CPU seconds of this process so far, every thread's (how parallel XLA's compile is)."""
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def compile_at(n: int) -> None:
    """The search's program at n per device (autoscale's Search), lowered and compiled."""
    c = autoscale.probe_config(cfg, algos.get(cfg.algo), n)
    trainer = Trainer(plan_lib.on_devices(c, one))
    t = time.perf_counter()
    lowered = trainer.lower(trainer.abstract_state())
    t_lowered, cpu = time.perf_counter(), cpu_s()
    lowered.compile()
    done = time.perf_counter()
    print(f"{n:,} per device: lowering {t_lowered - t:.2f} s, compiling {done - t_lowered:.2f} s "
          f"({cpu_s() - cpu:.1f} CPU s; done {done - start:.1f} s after the start)", flush=True)


if mode == "seq":
    for n in sizes:
        compile_at(n)
else:
    with concurrent.futures.ThreadPoolExecutor(len(sizes)) as pool:
        list(pool.map(compile_at, sizes))
print(f"{mode} {sizes}: {time.perf_counter() - start:.1f} s in all", flush=True)
