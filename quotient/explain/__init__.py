"""The operator's view: ``quotient explain`` and the ``kubectl quotient`` plugin (``explain``, ``queues``, ``top``).

``gather`` reads the API objects and the scheduler leader's ``/metrics`` (``scrape``) through the user's kubeconfig;
``facts`` decodes what Quotient wrote into them; ``explaining``, ``queuetable`` and ``toptable`` are pure (facts in,
a report out); ``rendering`` and ``tables`` turn reports into text, ``document`` into versioned JSON; ``plugin`` is
the command. docs/explain.md describes the commands and the JSON schema.
"""
