"""Convolution 1x1 as a linear layer (linear.wgsl): block-quantized weights kept as their codes
(up to 4 bits with the linear map: 8 codes a word; other maps and 8 bits: 4 a word) and
dequantized in the kernel, fp16/fp32 weights as fp32 words. Packed once at load into chunks of
output rows, each within one storage binding (max_storage_buffer_binding_size); a larger weight
is split, each chunk one dispatch writing its rows of the output. 4-bit codes of the linear map
with ic and the block size multiples of 32 read 32 codes a load: on a GPU linear_q4.wgsl (8 lanes
per row summed by subgroup shuffles, or workgroup memory without subgroups; 8 tokens per
work-group in prefill). On a CPU adapter (lavapipe: a storage-buffer read is a loop over the
lanes, a texel fetch a vector gather) they are textures instead (Texels, linear_q4_texel*.wgsl;
read-only storage textures where the device binds six, a work-group's rows one band, (scale,
zero) as two f16 where they are f16 exactly): one token 16 rows per invocation, its input a uniform block, and a decode step's layers that read
one input (q and k; gate and up) one dispatch (fused_with, linear_q4_texel3.wgsl); several
tokens 16 rows x 4 tokens per invocation, the input copied to a texture. A layer the textures do
not take runs linear_q4_rows.wgsl (eight rows of one token per invocation) and linear_q4_tile.wgsl (four
rows of four tokens, the input in windows of tokens bound as uniform blocks); the rest linear.wgsl."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnnllm_core.backend_api import ConvolutionWeights, QuantizedWeight, Refused, linear_creator

from ..device import CopyToTexture, Program, StepsExecution, pack_params, wgsl
from ..shaders import SUM8_SHARED, SUM8_SUBGROUP, X_TEXTURE, X_UNIFORM

ROWS_PER_GROUP = 8  # output rows of a work-group in linear.wgsl (x 8 lanes)
TEXEL_GROUP_ROWS = 128  # output rows of a work-group in linear_q4_texel.wgsl (a texture's width: a multiple)
TEXEL_TILE_ROWS, TEXEL_TILE_TOKENS = 128, 4  # of one in linear_q4_texel_tile.wgsl
TEXEL_FUSED = 3  # decode layers on one input in one linear_q4_texel3.wgsl dispatch, at most
PREFILL_TILE = 8  # tokens per work-group when there is more than one (decode: 1)


@dataclass(eq=False)
class Chunk:
    """Output rows [row0, row0 + rows) of a layer: their words, (scale, zero) pairs and bias."""

    row0: int
    rows: int
    weight: object
    scales: object
    bias: object


@dataclass(eq=False)
class Texels:
    """A 4-bit layer as textures (linear_q4_texel_common.wgsl): rows folded into bands of `width`
    columns, texel (c, band * vecs + k) holding codes 32k .. 32k + 31 of row band * width + c,
    (c, band * blocks + b) that row's block b (scale, zero) as f32 bits."""

    width: int
    weight: object
    scales: object
    bias: object
    half_scales: bool = False  # (scale, zero) as two f16 in one r32uint texel (they are f16 exactly)
    storage: bool = False  # read as read-only storage textures (texel_storage), else sampled ones

    def defines(self, x_inputs: str, xv: int = 0) -> tuple:
        """The linear_q4_texel*.wgsl defines: the common part, the input (X_UNIFORM of XV vec4, or
        X_TEXTURE), the textures' types and their loads (a level argument for sampled ones only)."""
        scale_format = "r32uint" if self.half_scales else "rg32uint"
        if self.half_scales:
            fetch = "unpack2x16float(textureLoad(sz, at${LEVEL}).x)"
        else:
            fetch = "bitcast<vec2<f32>>(textureLoad(sz, at${LEVEL}).xy)"
        if self.storage:
            types = ("texture_storage_2d<rgba32uint, read>", f"texture_storage_2d<{scale_format}, read>", "")
        else:
            types = ("texture_2d<u32>", "texture_2d<u32>", ", 0")
        return (("COMMON", wgsl("linear_q4_texel_common")), ("X_INPUTS", x_inputs), ("SZ_FETCH", fetch),
                ("W_TEXTURE", types[0]), ("SZ_TEXTURE", types[1]), ("LEVEL", types[2]), ("XV", xv))


@dataclass(eq=False)
class PackedLinear:
    """A layer's device buffers, shared by every clone of its Execution."""

    oc: int
    ic: int
    bits: int  # 4 or 8: codes a word hold; 32: fp32 weights
    offset: int
    block: int
    words: int  # words of one output row
    has_bias: bool
    chunks: list[Chunk]  # storage buffers (none when texels hold the layer)
    texels: Texels | None = None

    @property
    def nbytes(self) -> int:
        if self.texels is not None:
            t = self.texels
            return (t.weight.texture.size[0] * t.weight.texture.size[1] * 16
                    + t.scales.texture.size[0] * t.scales.texture.size[1] * (4 if t.half_scales else 8)
                    + t.bias.size)
        return sum(c.weight.size + c.scales.size + c.bias.size for c in self.chunks)

    @property
    def fast(self) -> bool:
        """Whether linear_q4.wgsl takes it: 4-bit codes, 32 of them in each (scale, zero) block."""
        return self.bits == 4 and self.block % 32 == 0 and self.ic % 32 == 0

    @property
    def aligned(self) -> bool:
        """Whether every word's codes share one block (one (scale, zero) per word)."""
        per = 32 // self.bits
        return self.bits != 32 and self.block % per == 0 and self.ic % per == 0


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint32 [oc, ceil(ic / per)]: code n of word k of a row in bits [bits*n, bits*(n+1))."""
    per = 32 // bits
    oc, ic = codes.shape
    words = -(-ic // per)
    padded = np.zeros((oc, words * per), np.uint32)
    padded[:, :ic] = codes
    padded = padded.reshape(oc, words, per)
    packed = np.zeros((oc, words), np.uint32)
    for n in range(per):
        packed |= padded[:, :, n] << np.uint32(bits * n)
    return packed


def pack_linear(backend, weights: ConvolutionWeights) -> PackedLinear | None:
    """The layer's words in chunks of rows that fit one binding; None when one row does not."""
    w, bias = weights.quantized, weights.nonzero_bias
    if isinstance(w, QuantizedWeight):
        codes, offset = w.offset_codes()
        bits = 4 if w.bits <= 4 and w.is_linear else 8
        words, scales, block = pack_codes(codes, bits), w.scale_zero(), w.block_size
    else:
        bits, offset, block = 32, 0, 1
        words = np.ascontiguousarray(weights.dequantize(), np.float32).view(np.uint32)
        scales = np.zeros((w.oc, 1, 2), np.float32)
    device, constant = backend.device, backend.allocator.constant
    biases = bias if bias is not None else np.zeros(w.oc, np.float32)
    if bits == 4 and backend.runtime.linear_lanes == 1:
        texels = pack_texels(backend, words, scales, block, biases)
        if texels is not None:
            return PackedLinear(w.oc, w.ic, bits, offset, block, words.shape[1], bias is not None, [], texels)
    row_bytes = max(words.shape[1] * 4, scales.shape[1] * 8)
    per_chunk = device.max_binding // row_bytes
    if per_chunk == 0:
        return None
    chunks = [Chunk(row0, min(per_chunk, w.oc - row0), constant(words[row0:row0 + per_chunk]),
                    constant(scales[row0:row0 + per_chunk]), constant(biases[row0:row0 + per_chunk]))
              for row0 in range(0, w.oc, per_chunk)]
    return PackedLinear(w.oc, w.ic, bits, offset, block, words.shape[1], bias is not None, chunks)


def pack_texels(backend, words: np.ndarray, scales: np.ndarray, block: int, biases: np.ndarray) -> Texels | None:
    """The layer as Texels, for a CPU adapter (lavapipe gathers texel fetches); None where the
    texel kernels do not take it: the block not a multiple of 32, ic of 64 (a token's row of the
    prefill's input texture: 256 bytes), a token's input larger than a uniform block (or not a
    multiple of its offset alignment), more rows or texels than a texture holds."""
    device = backend.device
    oc, n_words = words.shape
    ic, vecs, blocks = n_words * 8, n_words // 4, scales.shape[1]
    if (block % 32 or ic % 64 or ic * 4 > device.max_uniform or ic * 4 % device.uniform_alignment
            or ic // 4 > device.max_texture):
        return None
    # one work-group's rows a band where the texture is high enough: its texels one contiguous
    # run (lavapipe: 45 -> 40 ms of a decode step's 4-bit linears against bands of every row)
    most = device.max_texture - device.max_texture % TEXEL_GROUP_ROWS
    width = min(-(-oc // TEXEL_GROUP_ROWS) * TEXEL_GROUP_ROWS, most)
    if -(-oc // TEXEL_GROUP_ROWS) * max(vecs, blocks) <= device.max_texture:
        width = TEXEL_GROUP_ROWS
    bands = -(-oc // width)
    if width == 0 or bands * max(vecs, blocks) > device.max_texture:
        return None

    def folded(rows: np.ndarray) -> np.ndarray:  # [oc, n, c] -> [bands * n, width, c]
        padded = np.zeros((bands * width, *rows.shape[1:]), np.uint32)
        padded[:oc] = rows
        n, c = rows.shape[1:]
        return padded.reshape(bands, width, n, c).transpose(0, 2, 1, 3).reshape(bands * n, width, c)

    weight = folded(words.reshape(oc, vecs, 4))
    scales = np.ascontiguousarray(scales, np.float32)
    half = scales.astype(np.float16)
    # f16 pairs where that is exact (the file's scales are fp16): half the scale bytes, f32's sums
    half_scales = bool(np.array_equal(half.astype(np.float32), scales))
    if half_scales:
        bits = half.view(np.uint16).astype(np.uint32)
        scale_zero = folded((bits[:, :, 0] | bits[:, :, 1] << np.uint32(16))[:, :, None])
    else:
        scale_zero = folded(scales.view(np.uint32))
    allocator, storage = backend.allocator, texel_storage(device)
    return Texels(width, allocator.texture(*weight.shape, weight, storage=storage),
                  allocator.texture(*scale_zero.shape, scale_zero, storage=storage), allocator.constant(biases),
                  half_scales, storage)


def texel_storage(device) -> bool:
    """Whether the texel kernels read their textures as read-only storage textures: where the
    device binds as many as linear_q4_texel3.wgsl needs. lavapipe loads a storage texel as an
    address and a bounds check; a sampled one's load goes through its mip level (a decode step's
    4-bit linears ~44 -> ~31 ms of CPU)."""
    return device.max_storage_textures >= 2 * TEXEL_FUSED


def x_declaration(tokens: int, ic: int, max_uniform: int) -> str:
    """linear_q4_rows.wgsl's input: one token's row as a uniform block where it fits one
    (lavapipe loads a uniform value once for all lanes, a storage one lane by lane), else storage."""
    if tokens == 1 and ic * 4 <= max_uniform:
        return f"var<uniform> x: array<vec4<f32>, {ic // 4}>;"
    return "var<storage, read> x: array<vec4<f32>>;"


def tile_window(tokens: int, most: int) -> int:
    """Tokens per window of linear_q4_tile.wgsl (at most `most`, a uniform block's worth): the
    fewest windows, as even as multiples of 4 (an invocation's tokens) make them."""
    if tokens <= most:
        return tokens
    window = most - most % 4 if most >= 4 else most
    count = -(-tokens // window)
    even = -(-tokens // count)
    return min(window, even + -even % 4)


def tile_groups(oc: int) -> list[tuple[int, int, bool]]:
    """linear_q4_texel_tile.wgsl's dispatches over a layer's rows: (first group, groups, wide):
    128-row work-groups, and where the rows end 64 or fewer past a multiple of 128 (576, 192) the
    last 64 in a narrow one (WIDE false) rather than 128 computed for 64."""
    full, rest = divmod(oc, TEXEL_TILE_ROWS)
    if rest == 0 or rest > TEXEL_TILE_ROWS // 2:
        return [(0, -(-oc // TEXEL_TILE_ROWS), True)]
    return [(0, full, True), (full, 1, False)] if full else [(0, 1, False)]


class LinearExecution(StepsExecution):
    def __init__(self, backend, packed: PackedLinear, act: int):
        super().__init__(backend)
        self.packed, self.act = packed, act
        self.packed_bytes = packed.nbytes
        self.io = self.fused = None

    def on_resize(self, inputs, outputs) -> None:
        p = self.packed
        tokens = inputs[0].size // p.ic
        lanes = self.backend.runtime.linear_lanes
        self.steps = []
        x_bytes = inputs[0].storage.size if tokens != 1 else p.ic * 4  # a uniform block: its size exactly
        device = self.backend.device
        self.io, self.fused = None, None  # io: (input, output) of a texel decode layer (fused_with)
        if p.texels is not None:
            self.steps = self._texel_steps(inputs[0].storage, tokens, outputs[0].storage)
            if tokens == 1:
                self.io = (inputs[0].storage, outputs[0].storage)
            return
        if (lanes == 1 and p.fast and tokens > 1 and p.ic * 4 <= device.max_uniform
                and p.ic * 4 % device.uniform_alignment == 0):
            self.steps = [step for chunk in p.chunks for step in self._tiles(inputs[0].storage, chunk, tokens,
                                                                             outputs[0].storage)]
            return
        for chunk in p.chunks:
            tile = 1 if tokens == 1 else PREFILL_TILE  # tokens per work-group
            if p.fast:
                params = pack_params("10if", p.ic, p.oc, chunk.row0, chunk.rows, tokens, p.ic // 32, p.block // 32,
                                     p.ic // p.block, int(p.has_bias), self.act, float(p.offset))
                if lanes == 1:  # a CPU: 8 rows of one token per invocation
                    shader, rows_per_group, tile = "linear_q4_rows", 64 * 8, 1
                    defines = (("X_DECL", x_declaration(tokens, p.ic, self.backend.device.max_uniform)),)
                else:
                    shader, rows_per_group = "linear_q4", 64 // lanes
                    subgroups = self.backend.runtime.subgroups
                    defines = (("TILE", tile), ("LANES", lanes), ("ROWS", 1),
                               ("SUM8", SUM8_SUBGROUP if subgroups else SUM8_SHARED))
            else:
                shader, rows_per_group, defines = "linear", ROWS_PER_GROUP, (("TILE", tile),)
                params = pack_params("7if5i", p.ic, p.oc, chunk.row0, chunk.rows, tokens, p.words, p.bits,
                                     float(p.offset), p.block, max(1, p.ic // p.block), int(p.aligned),
                                     int(p.has_bias), self.act)
            groups = (-(-chunk.rows // rows_per_group), -(-tokens // tile), 1) if tokens else (0, 0, 0)
            self.steps.append(Program(self.backend.device, shader,
                                      [(inputs[0].storage, 0, x_bytes), chunk.weight, chunk.scales, chunk.bias,
                                       outputs[0].storage], params, groups, defines))

    def _tiles(self, x, chunk: Chunk, tokens: int, y) -> list:
        """linear_q4_tile.wgsl over windows of `window` tokens of x, each a uniform block (the
        last window ends at the last token, recomputing some rows of the one before)."""
        p = self.packed
        row_bytes = p.ic * 4
        window = tile_window(tokens, self.backend.device.max_uniform // row_bytes)
        steps = []
        for t0 in range(0, tokens, window):
            start = min(t0, tokens - window)
            params = pack_params("10ifi", p.ic, p.oc, chunk.row0, chunk.rows, window, p.ic // 32, p.block // 32,
                                 p.ic // p.block, int(p.has_bias), self.act, float(p.offset), start)
            groups = (-(-chunk.rows // (64 * 4)), -(-window // 4), 1)
            steps.append(Program(self.backend.device, "linear_q4_tile",
                                 [(x, start * row_bytes, window * row_bytes), chunk.weight, chunk.scales, chunk.bias,
                                  y], params, groups, (("XV", window * p.ic // 4),)))
        return steps

    def _texel_steps(self, x, tokens: int, y) -> list:
        """linear_q4_texel.wgsl for one token (its input a uniform block); for several,
        linear_q4_texel_tile.wgsl on windows of tokens copied to a texture (the whole input
        where it fits one)."""
        p, t, device = self.packed, self.packed.texels, self.backend.device
        if tokens == 0:
            return []
        layer = (p.oc, t.width, p.ic // 32, p.block // 32, p.ic // p.block, int(p.has_bias), self.act, float(p.offset))
        if tokens == 1:
            return [Program(device, "linear_q4_texel", [(x, 0, p.ic * 4), t.weight, t.scales, t.bias, y],
                            pack_params("7if", *layer), (-(-p.oc // TEXEL_GROUP_ROWS), 1, 1),
                            t.defines(X_UNIFORM, p.ic // 4))]
        window = min(tokens, device.max_texture)
        rows = self.backend.allocator.texture(window, p.ic // 4, storage=t.storage)
        steps = []
        for t0 in range(0, tokens, window):
            count = min(window, tokens - t0)
            steps.append(CopyToTexture(rows, x, t0 * p.ic * 4, p.ic * 4, count))
            for group0, groups, wide in tile_groups(p.oc):
                steps.append(Program(device, "linear_q4_texel_tile", [rows, t.weight, t.scales, t.bias, y],
                                     pack_params("7if3i", *layer, count, t0, group0),
                                     (groups, -(-count // TEXEL_TILE_TOKENS), 1),
                                     t.defines(X_TEXTURE) + (("WIDE", "true" if wide else "false"),)))
        return steps

    def fused_with(self, following) -> tuple[int, list] | None:
        """This decode layer and the next one or two reading the same input (q, k, v; gate, up)
        as one linear_q4_texel3.wgsl dispatch; None where they do not fuse."""
        if self.io is None:
            return None
        layers = [self]
        for command in following[:TEXEL_FUSED - 1]:
            other = command.execution
            if not (isinstance(other, LinearExecution) and other.io is not None and other.io[0] is self.io[0]
                    and (other.packed.ic, other.packed.block, other.packed.offset, other.packed.texels.half_scales)
                    == (self.packed.ic, self.packed.block, self.packed.offset, self.packed.texels.half_scales)):
                break
            layers.append(other)
        if len(layers) == 1:
            return None
        key = tuple((layer, layer.io) for layer in layers)
        if self.fused is None or self.fused[0] != key:
            self.fused = (key, self._fused_program(layers))
        return len(layers) - 1, [self.fused[1]]

    def _fused_program(self, layers: list) -> Program:
        p, device = self.packed, self.backend.device
        groups = [-(-layer.packed.oc // TEXEL_GROUP_ROWS) for layer in layers]
        ends = np.cumsum(groups).tolist()
        padded = layers + [layers[-1]] * (TEXEL_FUSED - len(layers))  # bound, never reached
        buffers: list = [(self.io[0], 0, p.ic * 4)]
        for n, layer in enumerate(padded):
            t = layer.packed.texels
            buffers += [t.weight, t.scales, t.bias, layer.io[1] if n < len(layers) else device.dummy]
        column = lambda f: [f(layer) for layer in padded] + [0]  # noqa: E731
        params = pack_params("20i3if", *column(lambda e: e.packed.oc), *column(lambda e: e.packed.texels.width),
                             *column(lambda e: int(e.packed.has_bias)), *column(lambda e: e.act),
                             *(ends + [ends[-1]] * (4 - len(ends))), p.ic // 32, p.block // 32, p.ic // p.block,
                             float(p.offset))
        return Program(device, "linear_q4_texel3", buffers, params, (ends[-1], 1, 1),
                       p.texels.defines(X_UNIFORM, p.ic // 4))

    def on_clone(self, backend, op):
        return LinearExecution(backend, self.packed, self.act)


@linear_creator
def create_linear(backend, inputs, outputs, op, weights):
    if not backend.fits(inputs[0], outputs[0]):
        return Refused("an activation exceeds max_storage_buffer_binding_size")
    packed = pack_linear(backend, weights)
    if packed is None:
        return Refused("one weight row exceeds max_storage_buffer_binding_size")
    return LinearExecution(backend, packed, op.param.activation)


CREATORS = {"Convolution": create_linear}
