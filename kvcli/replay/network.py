"""Transfer and store times: measured on the replay's own server, or modelled for a server across a network.

Default (no ``--link-gbps``): what the replay measured on the given server. Measured requests move real KV and are
timed; the others are priced with :class:`ServerRates`, chunk-sized SET/GET timings calibrated on that same server
at the start of each trace (one round trip per request plus a cost per chunk; serialize/deserialize timings of the
same value on this machine).
When the server is remote, its network is in those timings.

Network model (``--link-gbps G``, ``--rtt-ms R``): a server across a link of ``G`` Gbit/s and ``R`` ms round trip.
Every request that hits pays one round trip plus its hit chunks' value bytes at link speed to retrieve them; every
request that stores pays one round trip plus the values and metadata it writes; every lookup pays one round trip on
top of the server time measured here (MGET of metadata: small values, round-trip bound). Serialize and deserialize
stay this machine's measured CPU time. The link is the bottleneck in this model (a 2-CPU Redis on loopback moves a
few GB/s; a 25 Gbit/s link 3.1 GB/s): server-side copy time is taken as overlapped with the wire.

    transfer = R * requests_with_hits + hit_bytes * 8 / (G * 1e9)
    store    = R * requests_that_store + (stored_value_bytes + metadata_bytes) * 8 / (G * 1e9) + serialize
    lookup   = measured lookup + R * lookups

Critical path (what delays the first token): lookup, transfer, deserialize. Background (what occupies the server
and the link, not the request, when stores are asynchronous as in LMCache and vLLM's offloading connectors):
serialize and store.

Priced (a flat rate, a prefill profile or a named accelerator prices the prefill: :func:`priced_overheads`):
every overhead comes from counts and models, none from this run's wall times, so the figures do not move with this
machine's load. Moving KV between the host and the serving device is priced at the device's rates
(:class:`DeviceRates`: a profile's measured load and save rates, the accelerator's host link, or with a flat rate
an assumed PCIe 5.0 x16 link), in place of this machine's serialize and
deserialize times; the Redis side is the network model, :data:`PRICED_LINK` for what ``--link-gbps`` / ``--rtt-ms``
do not give (a loopback Redis on the replaying machine says nothing of a serving fleet's, and its timings move
with this machine's load).

    lookup      = lookups * R
    transfer    = R * requests_with_hits + hit_bytes * 8 / (G * 1e9)
    deserialize = hit value bytes / device load rate
    store       = R * requests_that_store + (stored_value_bytes + metadata_bytes) * 8 / (G * 1e9)
                  + stored value bytes / device save rate
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ServerRates:
    """Seconds per chunk value on the replay's server and this machine (measured at the start of a trace).

    ``set_seconds`` / ``get_seconds``: write / read one more chunk's value in a batch (pipelined SETs, one MGET);
    ``set_round_trip_seconds`` / ``get_round_trip_seconds``: the batch's own cost (one round trip), paid once per
    request that stores / retrieves; ``serialize_seconds`` / ``deserialize_seconds``: encode / decode-and-verify
    one value; ``spread``: relative spread of the repeats (``t / median - 1``), a sample of this run's timing noise;
    ``wire``: SET and GET were timed on the server (False: a network model or a price stands for them, and they
    are 0 here).
    """

    set_seconds: float
    get_seconds: float
    serialize_seconds: float = 0.0
    deserialize_seconds: float = 0.0
    spread: tuple[float, ...] = ()
    set_round_trip_seconds: float = 0.0
    get_round_trip_seconds: float = 0.0
    wire: bool = True

    def get(self, chunks: int) -> float:
        """Seconds to retrieve ``chunks`` chunks in one request (0 for none)."""
        return self.get_round_trip_seconds + chunks * self.get_seconds if chunks else 0.0

    def put(self, chunks: int) -> float:
        """Seconds to serialize and store ``chunks`` chunks in one request (0 for none)."""
        return self.set_round_trip_seconds + chunks * (self.set_seconds + self.serialize_seconds) if chunks else 0.0


@dataclass(frozen=True)
class Link:
    """A network between the serving node and Redis: ``gbps`` Gbit/s, ``rtt_seconds`` round trip."""

    gbps: float
    rtt_seconds: float

    def seconds(self, value_bytes: float, round_trips: float) -> float:
        """Round trips plus bytes at link speed (seconds)."""
        return round_trips * self.rtt_seconds + value_bytes * 8 / (self.gbps * 1e9)

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"link_gbps": self.gbps, "rtt_seconds": self.rtt_seconds}


#: The network a priced replay puts between the serving node and Redis unless told (--link-gbps, --rtt-ms): a
#: 100 Gbit/s datacenter link with a 0.1 ms round trip. A stated assumption, shown in the report, not a
#: measurement: GPU servers reach their storage and front-end network at 100-400 Gbit/s per port (NVIDIA's DGX
#: H100 datasheet: two dual-port ConnectX-7, up to 400 Gb/s, for storage and in-band traffic), so 100 Gbit/s is a
#: share of one port; Redis's own documentation gives about 200 us for a round trip over 1 Gbit/s Ethernet
#: (redis.io, "Redis benchmark", "Factors impacting Redis performance"), and a faster network with kernel
#: networking halves that.
PRICED_LINK = Link(100.0, 1e-4)


@dataclass(frozen=True)
class DeviceRates:
    """Moving one chunk's KV between the host and the device that serves it, bytes of payload value per second:
    ``load`` (deserialize, checksum, copy to the device) and ``save`` (copy to the host, serialize); ``source``
    says where the rates come from."""

    load_bytes_per_second: float
    save_bytes_per_second: float
    source: str

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"load_bytes_per_second": self.load_bytes_per_second,
                "save_bytes_per_second": self.save_bytes_per_second, "source": self.source}


@dataclass(frozen=True)
class Overheads:
    """One chunk size's overhead by part (seconds): critical path and background. ``source`` says how they were
    found, for the report; ``timed``: summed from this run's timings on this machine (False: priced from counts
    and rates, :func:`priced_overheads`)."""

    lookup: float
    transfer: float
    deserialize: float
    serialize_store: float
    source: str
    timed: bool = True

    @property
    def critical(self) -> float:
        """Lookup + transfer + deserialize: what delays the first token."""
        return self.lookup + self.transfer + self.deserialize

    @property
    def background(self) -> float:
        """Serialize + store: what occupies the server and the link."""
        return self.serialize_store

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"lookup_seconds": self.lookup, "transfer_seconds": self.transfer,
                "deserialize_seconds": self.deserialize, "store_seconds": self.serialize_store,
                "critical_path_seconds": self.critical, "background_seconds": self.background,
                "source": self.source, "timed": self.timed}


def overheads(res, value_bytes: int, rates: ServerRates, link: Link | None) -> Overheads:
    """Overheads of one :class:`~kvcli.replay.results.ChunkSizeResult` (module docstring).

    Args:
        res: the chunk size's totals (counts, bytes, measured and per-chunk estimated seconds).
        value_bytes: one chunk's stored value (payload + serialization header), bytes.
        rates: this trace's per-chunk rates (serialize, for the network model).
        link: the network model, or None for what was measured on the given server.
    """
    deserialize = res.deserialize_seconds + res.deserialize_seconds_estimated
    if link is None:
        return Overheads(res.lookup_seconds, res.transfer_seconds_measured + res.transfer_seconds_estimated,
                         deserialize, res.store_seconds + res.store_seconds_estimated,
                         "timed here: lookups, transfers and (de)serialization on the given server")
    transfer = link.seconds(res.chunks_hit * value_bytes, res.hit_requests)
    stored = res.chunks_written * value_bytes + res.metadata_bytes_written
    store = link.seconds(stored, res.store_requests) + res.chunks_written * rates.serialize_seconds
    lookup = res.lookup_seconds + res.lookups * link.rtt_seconds
    return Overheads(lookup, transfer, deserialize, store,
                     f"timed here, with a network model: {link.gbps:g} Gbit/s, {link.rtt_seconds * 1e3:g} ms round "
                     f"trip added to this server's lookups; (de)serialization timed on this machine")


#: The normal distribution's standard deviation per unit of median absolute deviation (1 / Phi^-1(3/4)).
MAD_TO_SD = 1.4826


def repeat_spread(rates: ServerRates) -> float:
    """How far one timing of this server strays, relative: a robust standard deviation of the transfer
    calibration's repeats (``rates.spread``: ``t / median - 1`` of each timing), ``MAD_TO_SD`` times their median
    absolute deviation from their median (the standard deviation where the timings are normal). Robust because one
    stalled timing among the dozen (a 100 us SET that took 1 ms once) would set a plain standard deviation to
    several times the median, and with it an overhead interval as if every timing of the run could stall alike;
    the overheads themselves are sums of this run's wall times, stalls included. 0 for fewer than 2 repeats."""
    spread = np.asarray(rates.spread, dtype=np.float64)
    if spread.size < 2:
        return 0.0
    return float(MAD_TO_SD * np.median(np.abs(spread - np.median(spread))))


def priced_overheads(res, value_bytes: int, link: Link, device: DeviceRates) -> Overheads:
    """Overheads of one :class:`~kvcli.replay.results.ChunkSizeResult` priced from its counts (module docstring,
    "Priced"): deterministic given the counts, the network model and the device's rates.

    Args:
        res: the chunk size's totals (lookups, hit and written chunks, requests that hit and that store, bytes).
        value_bytes: one chunk's stored value (payload + serialization header), bytes.
        link: the network between the serving node and Redis.
        device: host <-> device rates.
    """
    hit_bytes, written_bytes = res.chunks_hit * value_bytes, res.chunks_written * value_bytes
    lookup = res.lookups * link.rtt_seconds
    transfer = link.seconds(hit_bytes, res.hit_requests)
    store = link.seconds(written_bytes + res.metadata_bytes_written, res.store_requests)
    deserialize = hit_bytes / device.load_bytes_per_second
    store += written_bytes / device.save_bytes_per_second
    return Overheads(lookup, transfer, deserialize, store,
                     f"priced: network model {link.gbps:g} Gbit/s, {link.rtt_seconds * 1e3:g} ms round trip; KV to "
                     f"and from the device at {device.load_bytes_per_second / 1e9:g} GB/s: {device.source}", False)
