"""The run of a plan, once it is planned: the lifecycle around it (harness.run.lifecycle), the recipe
(harness.run.recipe.Run: setup, train, finalize, cleanup), the stages it calls (harness.run.stages), and the
training hooks the trainer carries: the run context (context), the callbacks (callbacks, checkpoint_callback), the
resume audit (audit), the learning-signal monitor (learning) and the loggers (loggers). Torch-free at import."""
