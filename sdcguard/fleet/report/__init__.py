"""What operators read from the store: the per-device report (:mod:`.devices`: table, JSON, CSV rows), the HTML
page (:mod:`.html` with :mod:`.svg` and :mod:`.html_assets`), plots (:mod:`.plot`) and the Prometheus textfile
(:mod:`.prometheus`), each written atomically (:mod:`.files`)."""

from .devices import REPORT_FIELDS, DeviceReport, build_report, report_csv_rows, report_json

__all__ = ["DeviceReport", "build_report", "report_json", "report_csv_rows", "REPORT_FIELDS"]
