# Issue 32 on the GPU: many runs in one program.
#   (a) 256 seeds of CartPole PPO with PureJaxRL's default config (4 envs x 128 steps, 5e5 steps
#       each) on one GPU: ours (--num-seeds 256) against PureJaxRL's own vmapped run
#       (experiments/gpu/purejaxrl_seeds.py; needs .gpu_ref/, see startup.sh);
#   (b) ours on 2 and 4 GPUs (as many as the machine has): the same 256 runs split over the
#       devices (strong scaling), and 256 runs per GPU (weak scaling: fixed work per device);
#   (c) PHASES="... minatar": Breakout- and SpaceInvaders-MinAtar PPO presets, 16 seeds each
#       (mean, IQM, 95% CI and the fraction above 28 / 131 from runs_summary.json).
# Run from the repo root:  bash experiments/gpu/run.sh seeds
# DRY=1 runs the same commands at toy sizes on a CPU machine.
source experiments/gpu/setup.sh
set -o pipefail
SEEDS=${SEEDS:-256}; STEPS=500000; MINATAR_STEPS=10000000; MINATAR_SEEDS=16
if [ "${DRY:-0}" = 1 ]; then SEEDS=4; STEPS=20480; MINATAR_STEPS=65536; MINATAR_SEEDS=2; fi
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}; [ "$GPUS" -ge 1 ] || GPUS=1  # GPUS=1: one GPU only
R=$(mktemp -d /tmp/runs.XXXX)
PHASES=${PHASES:-"purejaxrl ours"}
has() { [[ " $PHASES " == *" $1 "* ]]; }

ours() {  # $1 devices, $2 seeds (default $SEEDS)
  local seeds=${2:-$SEEDS} run=$R/cartpole-$1-${2:-$SEEDS}
  timeout 500 python3 -m jaxrl_mgpu.train --config cartpole --num-envs 4 --num-steps 128 --total-timesteps $STEPS \
      --num-seeds $seeds --devices $1 --log-every 61 --checkpoint-every 0 --compile-cache off --run-dir $run \
      --target-return 475 > $OUT/seeds_ours_$1_$seeds.log 2>&1; echo "ours $1 device(s) $seeds seeds exit $?" >> $OUT/phases.txt
  python3 - $run $1 $seeds <<'PY' | tee -a $OUT/seeds.jsonl
import json, sys
run, devices, seeds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = json.load(open(f"{run}/summary.json"))
c = json.load(open(f"{run}/runs_summary.json"))[0]
run_s = s["time_s"] - s["startup"]["compile_s"]  # the purejaxrl line times its run without the compile too
print(json.dumps({"label": "jaxrl_mgpu", "seeds": seeds, "devices": devices, "compile_s": s["startup"]["compile_s"],
                  "run_s": round(run_s, 2), "env_steps": s["env_steps"] * seeds,
                  "env_steps_per_s": round(s["env_steps"] * seeds / run_s), "final_return_mean": c["final_return_mean"],
                  "final_return_iqm": c["final_return_iqm"], "fraction_above_475": c["fraction_above_target"]}))
PY
}

has purejaxrl && (timeout 500 python3 experiments/gpu/purejaxrl_seeds.py --seeds $SEEDS --timesteps $STEPS \
    2>>$OUT/seeds_errors.log | tee -a $OUT/seeds.jsonl)
if has ours; then
  for d in ${OURS_DEVICES:-1 2 4}; do  # weak scaling (SEEDS per GPU) where WEAK lists the count
    [ "$GPUS" -ge $d ] && ours $d && [[ " ${WEAK-2 4} " == *" $d "* ]] && ours $d $((SEEDS * d))
  done
fi
if has minatar; then
  for game in breakout spaceinvaders; do
    target=$([ $game = breakout ] && echo 28 || echo 131)
    timeout 580 python3 -m jaxrl_mgpu.train --config $game-minatar --num-seeds $MINATAR_SEEDS --total-timesteps $MINATAR_STEPS \
        --checkpoint-every 0 --target-return $target --run-dir $R/$game > $OUT/seeds_$game.log 2>&1
    echo "$game exit $?" >> $OUT/phases.txt
    cp $R/$game/runs_summary.json $OUT/seeds_${game}_summary.json 2>/dev/null
  done
fi
cat $OUT/phases.txt
