"""Everything a person sees: the report model (``model``: dataclasses, JSON) and the text
renderers (``text``). Pure: renderers format, they never decide.

``gdrprobe.report.to_json(report)`` is the CLI's ``--json``.
"""

from gdrprobe.report.model import to_dict, to_json

__all__ = ["to_dict", "to_json"]
