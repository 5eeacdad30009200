"""One configuration path for every shell: ``coda sim`` / ``coda compare``, ``coda serve``,
``coda fake-engine`` and the vLLM plugin's ``CODA_SCHEDULER_CONFIG`` read their settings through
the same loader (``load``), as strict schemas (``coda.strict``) that share the ``system`` and
``policies`` fields (``coda.policy.spec.PoliciesConfig``)."""
