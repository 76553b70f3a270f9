"""Everything TableTune runs inside a vLLM engine process.

* ``plugin`` — the ``vllm.general_plugins`` entry point: the compatibility layer and reject-all;
* ``compat`` — the engine-compatibility layer (fixes verified per vLLM version);
* ``scheduler`` — ``--scheduler-cls tabletune.vllm.scheduler.TableTuneScheduler``;
* ``lookup`` — what the scheduler puts in place of vLLM's ``dynamic_sd_lookup`` (control file,
  controller, fall-back to the last good table);
* ``controller_setup`` — setting the online controller (``tabletune.controller``) up in the
  engine: its environment, the prior, the engine's fingerprint.

Importing this package imports no vLLM; only ``scheduler`` does (and ``compat`` and ``plugin``
lazily, inside their functions). The names the launchers share with this package live in
``tabletune.core.vllm_contract``.
"""
