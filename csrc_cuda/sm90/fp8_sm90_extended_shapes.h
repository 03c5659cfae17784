// fp8_sm90_extended_shapes.h: included first (before any CUTLASS header) by the translation units of
// the configs whose tiles are not 64, 96, 128, 192 or 256 wide (fp8_sm90_inst_odd_*, _narrow_*).
//
// CUTLASS's builder takes a tile's full width as one wgmma only for those five widths unless its
// extended shapes are enabled; otherwise it tiles the width with the largest listed shape that
// divides it (64x32 for 160: five wgmmas per k step, each reading the A tile from shared memory
// again, and up to twice the time). Enabled in those units only: it adds about 30 % to a unit's
// compile time, and for the widths the other units instantiate the builder picks the same
// instruction with or without it.
#pragma once

#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
