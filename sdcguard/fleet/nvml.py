"""NVML as a second opinion: which of the readings the scanner keeps around each GPU scan (``store.hardware``,
:class:`~.store.rows.NvmlScan`) are the hardware's own events, and how the report and the policy name them.

A hardware event of a scan is one of: an XID of :data:`HARDWARE_XIDS` delivered while it ran, volatile double-bit
ECC errors counted during it, rows remapped for uncorrectable errors during it, or a failed row remapping. Any other
XID is shown, never counted: most are the application's or the driver's. The report shows each GPU's latest scan;
the policy counts the events of the scans in its window only with ``[policy] nvml_errors`` (:mod:`.policy`).
"""

from __future__ import annotations

from .store.rows import NvmlScan

__all__ = ["HARDWARE_XIDS", "hardware_events", "nvml_text"]

HARDWARE_XIDS: frozenset[int] = frozenset({48, 63, 64, 79, 94, 95, 160, 171, 172})
"""The XIDs that are the GPU's own hardware failing, from NVIDIA's documentation: an uncorrectable ECC error (48;
171 and 172 say whether in DRAM or SRAM), contained (94) or not (95); a row remapping (or, before Ampere, a page
retirement) recorded (63) or failed (64), GPU memory marked for repair (160) (NVIDIA, "GPU Memory Error Management",
user-visible statistics; "Dynamic Page Retirement"); the GPU fallen off the bus (79) (NVIDIA's Xid catalog). Left
out, so shown but never evidence: the XIDs NVIDIA's Kubernetes device plugin ignores as the application's, after
which "the GPU should still be healthy" (13 graphics engine exception, 31 memory page fault, 43 GPU stopped
processing, 45 preemptive cleanup, 68 video processor exception); 74, an NVLink error, which NVIDIA says may be the
device at the link's other end; 92, a high rate of corrected single-bit errors (nothing computed wrong); and every
other XID (the catalog's many driver and firmware events)."""


def hardware_events(r: NvmlScan) -> tuple[str, ...]:
    """The scan's hardware events, in the words of a policy's reason: ``XID 79``, ``DBE +2``, ``uncorrectable
    remapped rows +1``, ``remap failure``; none: nothing counts."""
    events = [f"XID {x}" for x in dict.fromkeys(r.xids) if x in HARDWARE_XIDS]
    if r.dbe_growth:
        events.append(f"DBE +{r.dbe_growth}")
    if r.uncorrectable_rows_growth:
        events.append(f"uncorrectable remapped rows +{r.uncorrectable_rows_growth}")
    if r.remap_failure:
        events.append("remap failure")
    return tuple(events)


def nvml_text(r: NvmlScan | None) -> str | None:
    """The report's cell: the hardware events in lower case (``xid 79, dbe +2``), the other XIDs marked as not
    counted (``xid 13 (not counted)``), or ``ok``; None: no NVML reading (not a GPU, or never scanned)."""
    if r is None:
        return None
    other = [f"xid {x} (not counted)" for x in dict.fromkeys(r.xids) if x not in HARDWARE_XIDS]
    return ", ".join([e.lower() for e in hardware_events(r)] + other) or "ok"
