# Start-up and time to solve CartPole on one GPU (issue 27). Run through the device tool:
#   bash experiments/gpu/startup.sh
# Needs, beside the tree: .gpu_base/ (`git archive` of the commit to compare against, unpacked)
# and .gpu_ref/ (PureJaxRL's purejaxrl/ppo.py and wrappers.py, with gymnax 1.0's six-value
# `step` in the wrappers and the brax/navix imports removed). Logs go to $OUT.
source experiments/gpu/setup.sh
T=$PWD/experiments/gpu/time_to_solve.py
(cd .gpu_base && python3 $T --label before-cold --log $OUT/before_cold.log -- python3 -m jaxrl_mgpu.train --run-dir /tmp/r_old)
python3 $T --label cold --log $OUT/cold.log -- python3 -m jaxrl_mgpu.train --run-dir /tmp/r_a --compile-cache /tmp/cc
for k in b c d; do
  python3 $T --label warm-$k --log $OUT/warm_$k.log -- python3 -m jaxrl_mgpu.train --run-dir /tmp/r_$k --compile-cache /tmp/cc
done
(cd .gpu_ref && python3 $T --label purejaxrl-cold --log $OUT/purejaxrl.log -- python3 ppo.py)
python3 -c "import json; [print(k, json.load(open(f'/tmp/r_{k}/summary.json'))['startup']) for k in 'abcd']"
# steady state, before and after, each in processes of its own, twice
for r in 0 1; do for side in after before; do dir=.; [ $side = before ] && dir=.gpu_base
  (cd $dir && echo "$side r$r $(python3 -m jaxrl_mgpu.bench --envs-per-device 2048 --devices 1 --num-steps 128 \
     --updates 5 --repeats 5 2>&1 | grep -E '^jaxrl_mgpu ')"); done; done 2>&1 | tee $OUT/bench_ab.txt
timeout 200 python3 experiments/gpu/unroll_sweep.py 1,4,8 32,2048 2>&1 | grep "^{" | tee $OUT/unroll.jsonl
