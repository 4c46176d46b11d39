"""wavefuse's own kernels launched inside the peers process (peers.py
--wavefuse-ptx PATH): the same tensors, the same rotation and the same
torch.cuda.Event timer as the torch.compile kernels they are compared with,
so a cross-process difference in timing or allocation cannot decide a tie.

The PTX is the one the host crate embeds (bundle/ptx/wavefuse_sm_90.ptx),
loaded with the CUDA driver API through ctypes into PyTorch's current
context. The launch geometry below must equal the host crate's
(wavefuse_shared::AddLnShape for add+LayerNorm, wavefuse_shared::layout's
gather_layout for the gather); every timed function is first checked against
eager PyTorch by peers.py (max_abs_diff_vs_eager), which a wrong geometry
would fail.
"""
import ctypes

import torch

ROW_BLOCK = 256  # wavefuse_shared::layout::ROW_BLOCK
# wavefuse_shared::geometry: ATTN_WAVES warps per (window, head) workgroup and
# its workgroup memory (q, k, v tiles of 144 rows at a 40-half stride, each
# warp's 16-row bias buffer at a 152-half stride, the window's 144 int32
# region labels, the one-hot key tile of 144 rows at an 8-half stride, then
# each warp's 16 x 32-half output strip): 55,104 bytes.
ATTN_WAVES = 3
ATTN_SHARED_BYTES = (3 * 144 * 40 * 2 + ATTN_WAVES * 16 * 152 * 2 + 144 * 4 + 144 * 8 * 2
                     + ATTN_WAVES * 16 * 32 * 2)
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class Driver:
    def __init__(self, ptx_path):
        self.cu = ctypes.CDLL("libcuda.so.1")
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # makes the primary context current
        with open(ptx_path, "rb") as f:
            ptx = f.read().replace(b"\0", b"") + b"\0"
        self.mod = ctypes.c_void_p()
        self._check(self.cu.cuModuleLoadData(ctypes.byref(self.mod), ctypes.c_char_p(ptx)),
                    "cuModuleLoadData")
        self.funcs = {}
        self.raised = set()
        self.cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: CUresult {rc}")

    def func(self, name):
        if name not in self.funcs:
            f = ctypes.c_void_p()
            self._check(self.cu.cuModuleGetFunction(ctypes.byref(f), self.mod, name.encode()),
                        f"cuModuleGetFunction({name})")
            self.funcs[name] = f
        return self.funcs[name]

    def launch(self, name, grid, block, args, shared=0):
        """grid: workgroups, or (x, y) of them; args: ctypes scalars
        (c_uint64 for pointers and u64, c_uint32, c_float); shared:
        launch-sized workgroup memory in bytes (above 48 KiB the kernel's
        limit is raised first, as the host crate does)."""
        f = self.func(name)
        if shared > 48 * 1024 and (name, shared) not in self.raised:
            self._check(self.cu.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                   ctypes.c_int(shared)), "cuFuncSetAttribute")
            self.raised.add((name, shared))
        params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        gx, gy = grid if isinstance(grid, tuple) else (grid, 1)
        self._check(self.cu.cuLaunchKernel(f, gx, gy, 1, block, 1, 1, shared, stream,
                                           params, None), f"cuLaunchKernel({name})")


def ptr(t):
    return ctypes.c_uint64(t.data_ptr())


def add_layer_norm(drv):
    """(residual, branch) -> (r, y), like peers.op_add_layer_norm (eps 1e-5)."""
    def fn(residual, branch):
        rows, width = residual.shape
        r = torch.empty_like(residual)
        y = torch.empty_like(residual)
        # wavefuse_shared::AddLnShape::for_width(width, nvptx=True): 2 rows
        # per 32-lane group in one-warp workgroups at 384; 1 row per group
        # in ROW_BLOCK-thread workgroups otherwise.
        per_block, block = (2, 32) if width == 384 else (ROW_BLOCK // 32, ROW_BLOCK)
        drv.launch(f"wf_add_layer_norm_{width}", -(-rows // per_block), block,
                   [ptr(residual), ptr(branch), ptr(r), ptr(y), ctypes.c_uint64(0),
                    ctypes.c_uint64(0), ctypes.c_uint64(rows), ctypes.c_float(1e-5)])
        return r, y
    return fn


def gather(drv, table):
    """x [Z,H,W,C] -> window-partitioned tokens, like peers.op_gather; table
    is the int32 partition table (-1 = zero padding)."""
    def fn(x):
        width = x.shape[-1]
        n_src = x.numel() // width
        n_out = table.numel()
        out = torch.empty((n_out, width), device=x.device, dtype=x.dtype)
        lanes = {192: 16, 384: 32}[width]  # layout::gather_layout
        drv.launch(f"wf_gather_{width}", -(-n_out // (ROW_BLOCK // lanes)), ROW_BLOCK,
                   [ptr(x), ptr(table), ptr(out), ctypes.c_uint64(n_out), ctypes.c_uint64(n_src)])
        return out
    return fn


def window_attention(drv, windows, heads, n_types, n_slots, name="wf_window_attention_mask_144",
                     qkv_bias=None):
    """(qkv, bias, mask, type_idx, slot_idx, labels) -> out [windows*144,
    32*heads], like peers.make_window_attention (scale 32^-0.5; with
    `qkv_bias`, an f16 tensor [3 * 32 * heads], the kernel adds it to q, k
    and v first); the kernel reads the mask as the int32 region labels
    [slots, 144] (mask is their tile form, for PyTorch); the int64 maps
    become the int32 tables the kernel reads (converted once per map
    tensor)."""
    scale = ctypes.c_float(32 ** -0.5)
    tables = {}

    def fn(qkv, bias, mask, type_idx, slot_idx, labels):
        key = (type_idx.data_ptr(), slot_idx.data_ptr())
        if key not in tables:
            tables[key] = (type_idx.to(torch.int32).contiguous(), slot_idx.to(torch.int32).contiguous())
        ty, sl = tables[key]
        out = torch.empty((windows * 144, 32 * heads), device=qkv.device, dtype=qkv.dtype)
        # Workgroups (heads, windows): the kernel reads its head from x and
        # its window from y (up to 65535 windows; the host op splits longer
        # launches). A driver may carry another build's workgroup memory
        # and grid (`#1d`: windows * heads workgroups, an older kernel's
        # grid; `#2h`: (heads / 2, windows), two heads per workgroup).
        form = getattr(drv, "grid", "")
        grid = windows * heads if form == "1d" else (heads // (2 if form == "2h" else 1), windows)
        drv.launch(name, grid, getattr(drv, "threads", ATTN_WAVES * 32),
                   [ptr(qkv), ctypes.c_uint64(0) if qkv_bias is None else ptr(qkv_bias), ptr(out),
                    ptr(bias), ptr(labels), ptr(ty), ptr(sl),
                    ctypes.c_uint32(heads), ctypes.c_uint32(n_types), ctypes.c_uint32(n_slots), scale],
                   shared=getattr(drv, "shared", ATTN_SHARED_BYTES))
        return out
    return fn
