"""A randomized fault-injection suite on a real CeleryExecutor deployment whose workers and
checkpoint database run on hosts of their own (network namespaces on this machine), and a checker
of what was committed. ``hosts`` builds the network, ``faults`` breaks it, ``workloads`` names the
DAGs of tests/dags/chaos_dags.py, ``checker`` proves the guarantees per trial, ``trials`` runs them
(``python -m support.chaos``, ``make chaos``)."""
