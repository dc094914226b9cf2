"""JAX side of sharded zeroing: the ``pallas`` kernel on every shard, through ``shard_map``.

The buffer is one ``jax.Array`` of ``int32[num_shards * shard_rows, 128]`` sharded on
dimension 0 over the layout's shard axes (``PartitionSpec(shard_axes, None)``; other mesh
axes hold replicas). Block ids are global. Host ids are routed on the host: each shard
receives only its own local ids (a ``[num_shards * bucket]`` array sharded like the
buffer). Device ids are replicated to every shard, which routes them in its own step: ids
it does not own become invalid slots of :meth:`PallasZeroer.apply_masked` (no writes, no
error). No gather of the buffer, no collective; the result keeps the input's sharding
and is donated.

Bad ids: host ids outside the global pool raise before anything runs; in a device batch
such an id writes nothing on any shard and :meth:`check` raises later (the batch's valid
ids are zeroed, as with the single-device zeroers).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from kvlayout.errors import BackendError, LayoutBufferError, TableError, bad_value
from kvlayout.sharding import ShardedLayout

from .plan import LANES, ROW_BYTES
from .zeroer import (
    BadIdCount,
    PallasZeroer,
    check_id_array,
    check_ids_devices,
    check_int32_array,
    check_not_donated,
    check_num_ids,
    device_order,
    ids_in_range,
    run_step,
    step_ids,
)

#: Persistent GPU programs per SM for routed device ids (H200 sweep: 4 x 16 rows x 4 warps best).
PERSISTENT_PROGRAMS_PER_SM = 4
#: SMs assumed when a device does not report ``core_count`` (an H200's 132).
DEFAULT_SMS = 132


def _check_mesh(layout: ShardedLayout, mesh: Mesh) -> None:
    if not isinstance(mesh, Mesh):
        raise LayoutBufferError(
            f"mesh type = {type(mesh).__name__}: must be a jax.sharding.Mesh",
            field="mesh",
            value=type(mesh).__name__,
        )
    got = tuple((str(a), int(mesh.shape[a])) for a in mesh.axis_names)
    if got != layout.mesh_axes:
        raise LayoutBufferError(
            f"mesh axes = {dict(got)}: the layout was planned for {dict(layout.mesh_axes)} "
            "(same names, sizes and order)",
            field="mesh",
            value=dict(got),
        )


class ShardedPallasZeroer:
    """Zero global block ids of a sharded KV buffer over ``mesh``, in place.

    Construct once per (layout, mesh): every shard's table is verified and planned. Then
    ``buf = zeroer(buf, block_ids)`` per step; :meth:`apply` is the traceable form for a
    user's own ``jax.jit``. Keyword arguments go to the per-shard :class:`PallasZeroer`.

    Thread safe as :class:`PallasZeroer` is: concurrent calls on different buffers are fine
    (the bad-id count is locked); calls on one (donated) buffer must be chained.
    """

    def __init__(self, layout: ShardedLayout, mesh: Mesh, **kwargs: Any) -> None:
        if type(layout) is not ShardedLayout:  # a subclass's own block_shard() / _owned() routed ids to
            kind = type(layout).__name__  # another shard's buffer (pass 32)
            sub = isinstance(layout, ShardedLayout)
            itself = " itself (a subclass's methods route the ids)" if sub else ""
            msg = f"layout type = {kind}: must be a kvlayout.ShardedLayout{itself}"
            raise TableError(msg, field="layout", value=kind)
        layout.require_safe()
        _check_mesh(layout, mesh)
        if "offset" in kwargs:
            raise LayoutBufferError(
                "offset: sharded buffers hold the local layout at row 0 of each shard",
                field="offset",
                value=kwargs["offset"],
            )
        self.layout = layout
        self.mesh = mesh
        self.local = PallasZeroer(layout.local_table, **kwargs)
        # Device ids in block_sharded mode: every shard sees the whole batch, most of it other
        # shards' ids. The GPU kernel then uses persistent programs over the live items only
        # (H200, 8-way: 276 us against 706 us for the per-slot grid; with own ids only the
        # grid is faster, 229 against 270 us: bench/results/h200-sharded/pallas_persistent.json).
        self.local_routed = self.local
        if self.local.kernel == "triton" and layout.block_shards > 1 and kwargs.get("programs") is None:
            sms = getattr(mesh.devices.flat[0], "core_count", None) or DEFAULT_SMS
            self.local_routed = PallasZeroer(
                layout.local_table, **{**kwargs, "programs": PERSISTENT_PROGRAMS_PER_SM * int(sms)}
            )
        self.shard_rows = layout.shard_bytes // ROW_BYTES
        self.spec = P(layout.shard_axes or None, None)
        self.sharding = NamedSharding(mesh, self.spec)
        self.ids_sharding = NamedSharding(mesh, P())
        self._devices = tuple(mesh.devices.flat)  # the mesh's device order, as JAX compares it
        self._check_interpret_mesh()
        self._step = jax.shard_map(
            self._shard_step,
            mesh=mesh,
            in_specs=(self.spec, P()),
            out_specs=(self.spec, P()),
            check_vma=False,
        )
        self._jitted = jax.jit(self.apply, donate_argnums=0)
        # host ids are routed on the host: each shard gets only its own local ids
        self.routed_sharding = NamedSharding(mesh, P(layout.shard_axes or None))
        self._local_step = jax.shard_map(
            self._shard_step_local,
            mesh=mesh,
            in_specs=(self.spec, P(layout.shard_axes or None)),
            out_specs=self.spec,
            check_vma=False,
        )
        self._jitted_local = jax.jit(self._local_step, donate_argnums=0)
        self._bad = BadIdCount()

    def _check_interpret_mesh(self) -> None:
        """TPU interpret mode stages every callback operand on cpu:0; a shard running there
        blocks in the interpreter's cross-device barrier while the others wait for cpu:0, so
        such a mesh deadlocks. Refuse it with the fix instead of hanging."""
        if not (self.local.kernel == "tpu" and self.local.interpret and self.mesh.devices.size > 1):
            return
        cpu0 = jax.local_devices(backend="cpu")[0]
        if cpu0 in set(self.mesh.devices.flat):
            raise BackendError(
                "pallas TPU interpret mode under shard_map deadlocks when the mesh includes cpu:0 "
                "(the interpreter's callbacks stage their operands there): build the mesh from "
                "jax.devices()[1:] (force one more host device), "
                "or pass kernel='triton' (plain Pallas interpret)",
                field="mesh",
                value=str(cpu0),
            )

    # ---- description --------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self.local.mode

    @property
    def buffer_shape(self) -> tuple[int, int]:
        """Global ``int32[num_shards * shard_rows, 128]`` shape of the sharded buffer."""
        return (self.layout.num_shards * self.shard_rows, LANES)

    def _check_buffer_shape(self, buf: Any) -> None:
        """Type, dtype and exact global shape: static, so also checked on a traced buffer (apply)."""
        check_int32_array(buf)
        if tuple(buf.shape) != self.buffer_shape:
            raise LayoutBufferError(
                f"buffer shape = {tuple(buf.shape)}: must be {self.buffer_shape} "
                f"({self.layout.num_shards} shards x {self.shard_rows} rows)",
                field="buffer.shape",
                value=tuple(buf.shape),
            )

    def _check_shard_rows(self, buf: Any) -> None:
        """Inside shard_map: this shard's block must be exactly the ``[shard_rows, 128]`` the plan assumes
        (a wrong global shape shifts every shard's rows: the plan's writes land in other bytes)."""
        if tuple(buf.shape) != (self.shard_rows, LANES):
            raise LayoutBufferError(
                f"buffer shard shape = {tuple(buf.shape)}: must be {(self.shard_rows, LANES)} "
                f"(the global buffer must be {self.buffer_shape}, sharded as {self.spec})",
                field="buffer.shape",
                value=tuple(buf.shape),
            )

    def _check_buffer(self, buf: Any) -> None:
        self._check_buffer_shape(buf)
        sh = getattr(buf, "sharding", None)
        if not isinstance(sh, jax.sharding.Sharding) or not sh.is_equivalent_to(self.sharding, 2):
            self._check_buffer_devices(buf)
            raise LayoutBufferError(
                f"buffer sharding = {sh}: must be {self.sharding} "
                "(use make_buffer or jax.device_put(buf, zeroer.sharding))",
                field="buffer.sharding",
                value=str(sh),
            )

    def _check_buffer_devices(self, buf: Any) -> None:
        """A concrete buffer on the mesh's devices in another order (whose sharding prints like the mesh's)
        is refused saying so; JAX's own refusal was a raw ``ValueError``. Tracers are left to JAX."""
        if isinstance(buf, jax.core.Tracer) or not isinstance(buf, jax.Array):
            return
        got, want = device_order(buf.sharding), self._devices
        if got is None or got == want or set(got) != set(want):
            return
        ids = [d.id for d in got]
        why = (f"its devices are the mesh's in another order (device ids {ids}; the mesh's "
               f"{[d.id for d in want]}): jax.device_put(buf, zeroer.sharding)")
        raise LayoutBufferError(f"buffer sharding = {buf.sharding}: {why}", field="buffer.sharding",
                                value=str(buf.sharding))

    # ---- the per-shard step --------------------------------------------------------------
    def _shard_step(self, buf: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Inside shard_map: ``buf`` int32 ``[shard_rows, 128]`` (this shard), ``ids`` int32 ``[n]``
        (global)."""
        self._check_shard_rows(buf)
        lay = self.layout
        nbad = jnp.sum((ids < 0) | (ids >= lay.num_blocks)).astype(jnp.int32)
        if ids.shape[0] == 0:
            return buf, nbad
        j = jnp.zeros((), jnp.int32)
        for a in lay.block_axes:
            j = j * lay.axis_sizes[a] + jax.lax.axis_index(a).astype(jnp.int32)
        lo = j * lay.blocks_per_shard
        keep = (ids >= lo) & (ids < lo + lay.blocks_per_shard)  # owned here (so inside the global pool)
        local = jnp.where(keep, ids - lo, 0)
        return self.local_routed.apply_masked(buf, local, keep), nbad

    def _shard_step_local(self, buf: jax.Array, local: jax.Array) -> jax.Array:
        """Inside shard_map: ``local`` int32 ``[bucket]`` this shard's local ids, ``-1`` padding."""
        self._check_shard_rows(buf)
        keep = local >= 0
        return self.local.apply_masked(buf, jnp.where(keep, local, 0), keep)

    def route_host(self, block_ids: Any) -> jax.Array | None:
        """Validated host ids -> int32 ``[num_shards * bucket]`` of local ids sharded like the buffer.

        Shard ``k`` gets its own ids (``-1`` padding) in a power-of-two bucket of the largest
        shard's count, so no shard's kernel walks ids it does not own. ``None``: nothing to do.
        """
        routed = self.layout.route(block_ids)  # raises on a bad id before anything runs
        most = max(r.size for r in routed)
        if most == 0:
            return None
        bucket = max(8, 1 << int(most - 1).bit_length())
        arr = np.full((len(routed), bucket), -1, np.int32)
        for k, r in enumerate(routed):
            arr[k, : r.size] = r
        return jax.device_put(arr.reshape(-1), self.routed_sharding)

    def apply(self, buf: jax.Array, block_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Traceable: ``(buf, global ids int[n]) -> (buf, number of ids outside the pool)``.

        The buffer's dtype and exact global shape are checked first (static under trace), as
        :meth:`__call__` checks them: a buffer of other rows would shift every shard's layout.
        """
        self._check_buffer_shape(buf)
        check_not_donated(buf)
        self._check_buffer_devices(buf)
        ids = step_ids(block_ids)
        check_id_array(ids)
        check_ids_devices(ids, self._devices, "the mesh")
        ids32, ok = ids_in_range(ids, self.layout.num_blocks)  # no wide id wraps into the pool
        out, bad = self._step(buf, jnp.where(ok, ids32, -1))
        return out, bad

    def __call__(self, buf: jax.Array, block_ids: Any) -> jax.Array:
        """Zero global ``block_ids`` in the sharded ``buf`` (donated); returns the buffer."""
        self._check_buffer(buf)
        check_not_donated(buf)
        if not isinstance(block_ids, jax.Array):
            local = self.route_host(block_ids)  # the global pool; raises before anything runs
            return buf if local is None else run_step(self.local.serialised, self._jitted_local, buf, local)
        ids = block_ids
        check_id_array(ids)
        check_ids_devices(ids, self._devices, "the mesh")
        if ids.shape[0] == 0:
            return buf
        out, err = run_step(self.local.serialised, self._jitted, buf, ids)
        self._bad.add(err)
        return out

    zero_blocks = __call__

    def check(self) -> None:
        """Raise if a device batch so far had ids outside the global pool (synchronises; resets)."""
        self._bad.check(self.layout.num_blocks, "they wrote nothing on any shard")

    def lower(self, num_ids: int) -> Any:
        """Lower the jitted sharded step for ``num_ids`` ids on this mesh (e.g. of TPU topology devices).

        ``lower(n).compile()`` runs the real backend compiler on the whole SPMD program
        without running anything: how the sharded TPU kernel is compiled in CI without a TPU.
        """
        num_ids = check_num_ids(num_ids)
        buf = jax.ShapeDtypeStruct(self.buffer_shape, jnp.int32, sharding=self.sharding)
        ids = jax.ShapeDtypeStruct((num_ids,), jnp.int32, sharding=self.ids_sharding)
        return self._jitted.lower(buf, ids)

    # ---- host images ----------------------------------------------------------------------
    def make_buffer(self, gathered: np.ndarray | None = None) -> jax.Array:
        """A sharded buffer from gathered host bytes (uint8 ``[gathered_bytes]``), or zeros."""
        rows = self.buffer_shape[0]
        host = np.zeros((rows, LANES), np.int32)
        if gathered is not None:
            if not isinstance(gathered, np.ndarray) or gathered.dtype.hasobject:  # NumPy's raw TypeError
                is_array = isinstance(gathered, np.ndarray)
                kind = f"{gathered.dtype} array" if is_array else type(gathered).__name__
                why = "must be a NumPy array of plain data (the gathered bytes, uint8 [gathered_bytes])"
                raise bad_value(LayoutBufferError, "gathered", kind, why, shown=kind)
            raw = np.ascontiguousarray(gathered).reshape(-1).view(np.uint8)
            if raw.size != self.layout.gathered_bytes:
                raise LayoutBufferError(
                    f"gathered bytes = {raw.size}: must be {self.layout.gathered_bytes}",
                    field="buffer.nbytes",
                    value=raw.size,
                )
            host = raw.view(np.int32).reshape(rows, LANES)
        return jax.make_array_from_callback(self.buffer_shape, self.sharding, lambda idx: host[idx])

    def to_host(self, buf: jax.Array) -> np.ndarray:
        """The gathered bytes (uint8 ``[gathered_bytes]``): one replica of every shard."""
        return np.asarray(jax.device_get(buf)).reshape(-1).view(np.uint8).copy()

    def shard_images(self, buf: jax.Array) -> list[tuple[Any, int, np.ndarray]]:
        """``(device, shard index, bytes)`` for every addressable device, replicas included."""
        out = []
        for s in buf.addressable_shards:
            k = (s.index[0].start or 0) // self.shard_rows
            out.append((s.device, k, np.asarray(s.data).reshape(-1).view(np.uint8).copy()))
        return out
