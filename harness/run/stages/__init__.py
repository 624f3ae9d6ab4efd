"""The stages of a run, in order; each takes typed inputs and returns a record (the recipe, harness.run.recipe.Run,
calls them in its setup, train and finalize; docs/architecture.md draws them):

    plan       harness.plan.build_plan          -> Plan (the parent's plan inside)
    run dir    harness.rundir.claim             -> RunDir (lock, manifest, resume policy)
    data       harness.run.stages.data.prepare      -> Data (validated root, content digest, splits)
    policy     harness.policy.build_policy          -> Policy (base model, init, tuning, device)
    resume     harness.run.stages.resume.find       -> ResumePoint (newest intact checkpoint, or none)
    context    harness.run.recipe.open_context      -> RunContext (this rank's logs at the frontier, its counters)
    trainer    harness.run.stages.train.build       -> the arm's TRL trainer with the harness callbacks (trained by the
                                                   recipe; the resume audit attached by resume.audit_the_resume)
    finalize   harness.run.stages.finalize.finalize -> completion.json (final policy, eval after), written last

Only the recipe and the lifecycle write the run manifest between stages (RunDir.update, saved at once).
"""
