"""The stages of a run, in order; each takes typed inputs and returns a frozen record (harness.lifecycle
calls them, docs/architecture.md draws them):

    plan       harness.plan.build_plan          -> Plan (the parent's plan inside)
    run dir    harness.rundir.claim             -> RunDir (lock, manifest, resume policy)
    data       harness.stages.data.prepare      -> Data (validated root, content digest, splits)
    policy     harness.stages.policy.build      -> Policy (base model, init, tuning)
    resume     harness.stages.resume.find       -> ResumePoint (newest intact checkpoint, or none)
    train      harness.stages.train.train       -> Trained (the arm's TRL trainer run under the callbacks)
    finalize   harness.stages.finalize.finalize -> completion.json (final policy, eval after), written last

Only the lifecycle writes the run manifest between stages (RunDir.update, saved at once).
"""
