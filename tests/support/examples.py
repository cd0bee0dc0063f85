"""Facts about the example DAGs (``dags/``) that more than one test holds them to."""

from __future__ import annotations

#: The example DAGs with a schedule: unpausing one starts its latest scheduled run beside a manual
#: one (tests/integration/test_standalone_cli.py). tests/system/test_example_dags.py checks this
#: against the schedules the DAG files declare, so a new scheduled example is not left out.
SCHEDULED = ("chunked_example", "customer_export", "loan_report", "mapped_partitions", "partitioned_export",
             "partitioned_export_decorated", "taskflow_example")
