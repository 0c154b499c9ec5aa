// The device half of zig/src/exl3/codebook.zig: a 16-bit trellis state to an fp16 weight, with
// the format's rounding points (EXL3.md §6.2): 3INST and MCG are one __hadd of two masked halves,
// MUL1 one __hfma of (1024 + byte sum) by a fixed scale and bias.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

namespace tf {

enum Codebook : int { kInst3 = 0, kMcg = 1, kMul1 = 2 };

__device__ __forceinline__ half decode_sum_of_halves(uint32_t product) {
    // (x & 0x8FFF8FFF) ^ 0x3B603B60 keeps each half's sign, two exponent bits and mantissa.
    const uint32_t x = (product & 0x8FFF8FFFu) ^ 0x3B603B60u;
    const half low = __ushort_as_half(static_cast<unsigned short>(x & 0xFFFFu));
    const half high = __ushort_as_half(static_cast<unsigned short>(x >> 16));
    return __hadd(low, high);
}

__device__ __forceinline__ half decode_mul1(uint32_t product) {
    // dp4a with 0x01010101 sums the four bytes onto 0x6400, the fp16 bits of 1024.0, so the
    // result read as fp16 is exactly 1024 + byte sum. The unsigned overload: the bytes are 0..255
    // (the signed one reads them as -128..127 and gets a different sum).
    const unsigned int h_bits = __dp4a(product, 0x01010101u, 0x6400u);
    const half h = __ushort_as_half(static_cast<unsigned short>(h_bits));
    const half scale = __ushort_as_half(static_cast<unsigned short>(0x1EEE));
    const half bias = __ushort_as_half(static_cast<unsigned short>(0xC931));
    return __hfma(h, scale, bias);
}

__device__ __forceinline__ half decode_state(uint32_t state, int codebook) {
    switch (codebook) {
        case kInst3: return decode_sum_of_halves(state * 0x05517C72u + 0x03D45AA4u);
        case kMcg: return decode_sum_of_halves(state * 0xCBAC1FEDu);
        default: return decode_mul1(state * 0x83DCD12Du);
    }
}

}  // namespace tf
