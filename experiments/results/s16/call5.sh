# Session 16, call 5 (an H200 at last): issue 4's table at c75746e (s15/call5.sh's commands).
OUT=$OUT bash experiments/results/s15/call5.sh
