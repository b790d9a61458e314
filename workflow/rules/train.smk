# Training: one torchrun job per (method, learning rate, stage).
#
# The run folder results/train/{method}/lr{lr}/stage{i}/{key}/ holds the resumable state
# (state/step_K/, metrics.jsonl, training_args.json); only its final/ is a declared output.
# Snakemake deletes a job's declared outputs before it reruns the job, so the state survives
# a crash or a preemption, and the job always runs with --resume: run the same snakemake command
# again and training continues from the last state/step_K/.
#
# {key} is a hash of everything that defines the run (`run_key` in common.smk): the resolved
# options, which name the starting checkpoint (so a change upstream changes every later stage's
# key too), the data, and the launch geometry. Changed options therefore get a new, empty
# folder and train from scratch, instead of resuming a state that another configuration wrote.
# Old folders are left in place (delete them by hand).


rule train:
    """Fine-tune from the stage's starting weights on the stage's task (torchrun, FSDP2)."""
    input:
        unpack(train_inputs),
    output:
        directory("results/train/{method}/lr{lr}/stage{stage}/{key}/final"),
    params:
        launcher=torchrun_launcher(),
        nproc=config["launch"]["nproc_per_node"],
        run_dir=lambda wc: run_dir(wc.method, wc.lr, int(wc.stage)),
        flags=lambda wc: cli_flags(training_options(wc.method, wc.lr, int(wc.stage))),
    log:
        # Per attempt (Snakemake clears it when the job starts); a resumed attempt says so.
        "logs/train/{method}/lr{lr}/stage{stage}/{key}.log",
    benchmark:
        "results/benchmarks/train/{method}/lr{lr}/stage{stage}/{key}.tsv"
    threads: train_threads()
    resources:
        mem_mb=rule_resource("train", "mem_mb"),
        runtime=rule_resource("train", "runtime"),
        **train_node_resources(),
        # Snakemake's attempt number, for the job (MINI_TRAINER_ATTEMPT below): where Snakemake
        # retries (--retries), a retry of a job that ended with exit 2 (bad input) or 3
        # (diverged) stops at once, with the same status (mini_trainer/distributed/retry.py).
        attempt=lambda wildcards, attempt: attempt,
        # 1: the job deletes its state/ once final/ is written (keep_states_after_final: false).
        # A resource, not a param: changing it must not rerun finished jobs, whose states are gone.
        drop_states=drop_states_resource(),
    conda:
        "../envs/mini-trainer.yaml"
    shell:
        # One command: the engine decides what the run folder allows (`--resume auto`: start,
        # continue from the newest intact state, or move an attempt that saved no state aside to
        # <run_dir>.unsaved-<UTC time> and start over; a folder whose states are all damaged is
        # refused with exit 2, as `--resume` would). The folder's key guarantees it is this run.
        # Snakemake sets OMP_NUM_THREADS to the job's threads; split them between the processes
        # (computed here, not as a param, so running with more --cores reruns nothing).
        # MINI_TRAINER_STOP_WITH_PID: the job stops (state saved, exit 75) if this Snakemake is
        # killed, instead of training on unsupervised (mini_trainer/distributed/lifetime.py).
        # MINI_TRAINER_REQUEUE=1: in a Slurm job, a job that stopped with its state saved (exit
        # 75: preempted, time limit) or crashed (1) requeues its own Slurm job, which resumes;
        # Snakemake sees one job and submits nothing again (profiles/slurm: retries: 0).
        # MINI_TRAINER_DROP_STATES=1: `launch` adds --drop-states-after-final (the job deletes its
        # state/ once final/ is written; keep_states_after_final: true gives 0).
        # exec: the launcher replaces the rule's shell. Slurm's stop signal (--signal=TERM@600,
        # scancel --signal) goes to every process of the job step; a shell would die of it at
        # once, its job step would end as failed while the launcher, orphaned, still saves, and
        # Snakemake could see the job fail before the launcher requeues it.
        " MINI_TRAINER_STOP_WITH_PID=$PPID MINI_TRAINER_ATTEMPT={resources.attempt}"
        " MINI_TRAINER_REQUEUE=1"
        " MINI_TRAINER_DROP_STATES={resources.drop_states}"
        " OMP_NUM_THREADS=$(( ({threads} + {params.nproc} - 1) / {params.nproc} ))"
        " exec {params.launcher}"
        " {params.flags} --output-dir {params.run_dir:q} --resume auto > {log} 2>&1"
