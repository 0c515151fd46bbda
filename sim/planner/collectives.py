"""Times of collectives and transfers: T = alpha + N / BW with the ring algorithm's factors.

For n ranks on a ring, a buffer of N bytes per rank, per-hop latency alpha and per-rank
link bandwidth BW (one direction), the standard ring costs (Thakur et al. 2005; Patarasuk
and Yuan 2009; NCCL's "bus bandwidth" is N (n-1)/n / T for the first two):

- reduce-scatter, all-gather: (n - 1) alpha + (n - 1)/n x N / BW
- all-reduce (reduce-scatter then all-gather): 2 (n - 1) alpha + 2 (n - 1)/n x N / BW
- point-to-point: alpha + N / BW

One rank costs nothing. N is the full buffer (all-gather: the gathered size).
"""

from __future__ import annotations

from .cluster import Link


def reduce_scatter(num_bytes: float, ranks: int, link: Link) -> float:
    """Seconds to reduce-scatter an N-byte buffer over `ranks` ranks."""
    if ranks <= 1:
        return 0.0
    return (ranks - 1) * link.latency + (ranks - 1) / ranks * num_bytes / link.bandwidth


def all_gather(num_bytes: float, ranks: int, link: Link) -> float:
    """Seconds to all-gather into an N-byte buffer over `ranks` ranks."""
    return reduce_scatter(num_bytes, ranks, link)


def all_reduce(num_bytes: float, ranks: int, link: Link) -> float:
    """Seconds to all-reduce an N-byte buffer over `ranks` ranks (ring: reduce-scatter + all-gather)."""
    return 2.0 * reduce_scatter(num_bytes, ranks, link)


def point_to_point(num_bytes: float, link: Link) -> float:
    """Seconds to send N bytes to one peer."""
    return link.latency + num_bytes / link.bandwidth
