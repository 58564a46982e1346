"""Everything a person sees: the report model (``model``: dataclasses, JSON) and the text
renderers (``text``), and the doctor findings' ids (``finding_ids``), named once for the
checks that write them and the verdict that reads them. Pure: renderers format, they never
decide.

``gdrprobe.report.to_json(report)`` is the CLI's ``--json``;
``gdrprobe.report.write_check_prometheus(report, path)`` is ``gdrprobe check --prometheus``.
"""

from gdrprobe.report.check_metrics import write_check_prometheus
from gdrprobe.report.model import to_dict, to_json

__all__ = ["to_dict", "to_json", "write_check_prometheus"]
