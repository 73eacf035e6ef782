//go:build ignore

// neon_gen writes kernels_rows_arm64.s, the multi-row NEON kernels of
// package quant (see kernels_arm64.go for their contracts and vecdot.go for
// the numerics they reproduce bit for bit). Run it from engine/quant:
//
//	go run neon_gen.go
//
// It needs llvm-mc on PATH (Debian: llvm): the vector instructions the Go
// assembler does not know (SMULL, SMLAL by element, SDOT, ADDP, FMUL, FADD,
// SCVTF, FCVTL, lane loads...) are written here in Arm syntax, encoded by
// llvm-mc once, and emitted as WORDs, each followed by its Arm text.
//
// Every kernel comes in two integer flavours that give the same exact int32
// sums: "NEON" (SMULL/SMLAL into 16-bit lanes, widened; any ARMv8-A) and
// "SDOT" (ARMv8.2 dot product, gated on the CPU feature by the caller).
// The float steps are separate FMUL / FADD / FSUB in the pure-Go order, lane
// r of a vector holding activation row r (never FMLA).
package main

import (
	"bufio"
	"bytes"
	"fmt"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// asm collects the output; words are Arm instructions to encode.
type asm struct {
	lines []string
	words map[string]bool
}

// g emits a Go assembler line.
func (a *asm) g(format string, args ...any) {
	a.lines = append(a.lines, "\t"+fmt.Sprintf(format, args...))
}

// w emits an Arm instruction as a WORD (encoded in finish).
func (a *asm) w(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	a.words[s] = true
	a.lines = append(a.lines, "\x00"+s)
}

// raw emits a line as is (labels, comments, TEXT).
func (a *asm) raw(format string, args ...any) {
	a.lines = append(a.lines, fmt.Sprintf(format, args...))
}

// encode runs llvm-mc over every distinct Arm instruction once.
func encode(words map[string]bool) map[string]uint32 {
	var list []string
	for s := range words {
		list = append(list, s)
	}
	cmd := exec.Command("llvm-mc", "-triple=aarch64", "-mattr=+dotprod", "-show-encoding")
	cmd.Stdin = strings.NewReader(strings.Join(list, "\n") + "\n")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil || errb.Len() > 0 {
		log.Fatalf("llvm-mc: %v\n%s", err, errb.String())
	}
	enc := map[string]uint32{}
	i := 0
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		k := strings.Index(line, "encoding: [")
		if k < 0 {
			continue
		}
		bs := strings.Split(strings.TrimSuffix(line[k+len("encoding: ["):], "]"), ",")
		if len(bs) != 4 {
			log.Fatalf("llvm-mc: odd encoding %q", line)
		}
		var v uint32
		for j, b := range bs {
			x, err := strconv.ParseUint(strings.TrimSpace(b), 0, 8)
			if err != nil {
				log.Fatal(err)
			}
			v |= uint32(x) << (8 * j)
		}
		if i >= len(list) {
			log.Fatal("llvm-mc: more encodings than instructions")
		}
		enc[list[i]] = v
		i++
	}
	if i != len(list) {
		log.Fatalf("llvm-mc: %d encodings for %d instructions", i, len(list))
	}
	return enc
}

func (a *asm) finish(path string) {
	enc := encode(a.words)
	var b strings.Builder
	for _, l := range a.lines {
		if strings.HasPrefix(l, "\x00") {
			s := l[1:]
			fmt.Fprintf(&b, "\tWORD $0x%08x // %s\n", enc[s], s)
			continue
		}
		b.WriteString(l + "\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		log.Fatal(err)
	}
}

// Register use shared by the row kernels (Go names):
//
//	R10 weight row base, R0 weight block pointer
//	R19..R22 activation row bases, R1..R4 their block pointers
//	R11 nb, R5 blocks left, R6 rows left, R7 rb, R8 output pointer,
//	R9 ys*4 (bytes between output rows; 4-row kernels), R12..R17, R23 scratch
//	V30 the float accumulators (lane r: activation row r), V24..V27 the
//	integer block accumulators of rows 0..3.

// kernel describes one TEXT symbol.
type kernel struct {
	typ  string // "q4K", "q6K", "q8_0"
	rows int    // activation rows: 1 or 4
	dot  bool   // SDOT flavour
	bb   int    // weight block bytes
	ab   int    // activation block bytes
}

func (k kernel) name() string {
	n := k.typ + "Rows"
	if k.rows == 4 {
		n += "4"
	}
	if k.dot {
		return n + "SDOT"
	}
	return n + "NEON"
}

// prologue loads the arguments and emits the row loop head.
func (a *asm) prologue(k kernel) {
	if k.rows == 4 {
		a.raw("TEXT ·%s(SB), NOSPLIT, $0-80", k.name())
		a.g("MOVD w+0(FP), R10")
		a.g("MOVD a0+8(FP), R19")
		a.g("MOVD a1+16(FP), R20")
		a.g("MOVD a2+24(FP), R21")
		a.g("MOVD a3+32(FP), R22")
		a.g("MOVD nb+40(FP), R11")
		a.g("MOVD rows+48(FP), R6")
		a.g("MOVD rb+56(FP), R7")
		a.g("MOVD y+64(FP), R8")
		a.g("MOVD ys+72(FP), R9")
		a.g("LSL  $2, R9, R9")
	} else {
		a.raw("TEXT ·%s(SB), NOSPLIT, $0-48", k.name())
		a.g("MOVD w+0(FP), R10")
		a.g("MOVD a+8(FP), R19")
		a.g("MOVD nb+16(FP), R11")
		a.g("MOVD rows+24(FP), R6")
		a.g("MOVD rb+32(FP), R7")
		a.g("MOVD out+40(FP), R8")
	}
}

// rowHead starts a weight row: pointers reset, sumf = +0.
func (a *asm) rowHead(k kernel) {
	a.raw("rowloop:")
	a.g("MOVD R10, R0")
	for r := range k.rows {
		a.g("MOVD R%d, R%d", 19+r, 1+r)
	}
	a.g("MOVD R11, R5")
	a.w("movi v30.2d, #0")
}

// rowTail stores sumf (lane r to output row r), advances to the next
// weight row and returns after the last.
func (a *asm) rowTail(k kernel) {
	if k.rows == 4 {
		a.w("st1 {v30.s}[0], [x8]")
		a.g("ADD  R9, R8, R12")
		a.w("st1 {v30.s}[1], [x12]")
		a.g("ADD  R9, R12, R12")
		a.w("st1 {v30.s}[2], [x12]")
		a.g("ADD  R9, R12, R12")
		a.w("st1 {v30.s}[3], [x12]")
	} else {
		a.g("FMOVS F30, (R8)")
	}
	a.g("ADD  $4, R8")
	a.g("ADD  R7, R10, R10")
	a.g("SUBS $1, R6, R6")
	a.g("BNE  rowloop")
	a.g("RET")
}

// blockTail advances every pointer by one block and loops.
func (a *asm) blockTail(k kernel) {
	a.g("ADD  $%d, R0", k.bb)
	for r := range k.rows {
		a.g("ADD  $%d, R%d", k.ab, 1+r)
	}
	a.g("SUBS $1, R5, R5")
	a.g("BNE  blockloop")
}

// reduce leaves in dst lane r the sum of the 4 int32 lanes of v<base+r>
// (r < rows; exact, any order); tmp is clobbered.
func (a *asm) reduce(rows, base int, dst, tmp string) {
	if rows == 4 {
		a.w("addp %s.4s, v%d.4s, v%d.4s", dst, base, base+1)
		a.w("addp %s.4s, v%d.4s, v%d.4s", tmp, base+2, base+3)
		a.w("addp %s.4s, %s.4s, %s.4s", dst, dst, tmp)
		return
	}
	a.w("addp %s.4s, v%d.4s, v%d.4s", dst, base, base)
	a.w("addp %s.4s, %s.4s, %s.4s", dst, dst, dst)
}

// gatherD loads the float32 d of each activation row's block_q8_K (at R1..)
// into lane r of dst.
func (a *asm) gatherD(rows int, dst string) {
	if rows == 1 {
		a.g("FMOVS (R1), F%s", dst[1:])
		return
	}
	for r := range rows {
		a.w("ld1 {%s.s}[%d], [x%d]", dst, r, 1+r)
	}
}

// q4K: block_q4_K (144 B: d, dmin fp16; scales[12]; qs[128]) against
// block_q8_K (292 B: d float32; qs[256]; bsums int16[16]).
func q4K(a *asm, k kernel) {
	if k.rows == 4 {
		a.raw("// func %s(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)", k.name())
		a.raw("// y[j*ys+r] = genericQ4KDot(w + r*rb, a_j, nb) for r < rows, j < 4")
		a.raw("// (rows, nb >= 1): each weight block is decoded once for the 4")
		a.raw("// activation rows.")
	} else {
		a.raw("// func %s(w, a *byte, nb, rows, rb int, out *float32)", k.name())
		a.raw("// out[r] = genericQ4KDot(w + r*rb, a, nb) for r < rows (rows, nb >= 1).")
	}
	a.raw("// Per block: the scales and mins decoded as get_scale_min_k4 (the kmask")
	a.raw("// words of ggml_vec_dot_q4_K_q8_K); isum = sum_j sc_j * sum(q4*q8) and")
	if k.dot {
		a.raw("// imin = sum_j m_j*(bsums[2j]+bsums[2j+1]) exactly (SDOT sums per sub-block,")
		a.raw("// times the scale with MLA); then sumf += (d_w*d_a)*float32(isum),")
	} else {
		a.raw("// imin = sum_j m_j*(bsums[2j]+bsums[2j+1]) exactly (16-bit products,")
		a.raw("// |sum of 4| <= 7680, times the scale with SMLAL by element); then")
		a.raw("// sumf += (d_w*d_a)*float32(isum),")
	}
	a.raw("// sumf -= (dmin_w*d_a)*float32(imin) as kDotSums, lane r for row r.")
	a.prologue(k)
	a.w("movi v31.16b, #15")
	a.rowHead(k)
	a.raw("blockloop:")
	// Scales and mins (kmask trick): R15 = sc0..7 bytes, R16 = m0..7 bytes.
	a.g("MOVWU 4(R0), R12")
	a.g("MOVWU 8(R0), R13")
	a.g("MOVWU 12(R0), R14")
	a.g("ANDW  $0x3f3f3f3f, R12, R15")
	a.g("ANDW  $0x0f0f0f0f, R14, R16")
	a.g("LSRW  $6, R12, R17")
	a.g("ANDW  $0x03030303, R17, R17")
	a.g("ORRW  R17<<4, R16, R16")
	a.g("ORR   R16<<32, R15, R15")
	a.g("ANDW  $0x3f3f3f3f, R13, R16")
	a.g("LSRW  $4, R14, R17")
	a.g("ANDW  $0x0f0f0f0f, R17, R17")
	a.g("LSRW  $6, R13, R23")
	a.g("ANDW  $0x03030303, R23, R23")
	a.g("ORRW  R23<<4, R17, R17")
	a.g("ORR   R17<<32, R16, R16")
	a.g("VMOV  R15, V0.D[0]")
	a.g("VMOV  R16, V1.D[0]")
	a.w("uxtl v0.8h, v0.8b")        // scales, 16-bit
	a.w("uxtl v1.8h, v1.8b")        // mins, 16-bit
	a.w("zip1 v2.8h, v1.8h, v1.8h") // m0,m0,m1,m1,m2,m2,m3,m3
	a.w("zip2 v3.8h, v1.8h, v1.8h") // m4,m4,...,m7,m7
	if k.dot {
		a.w("uxtl v12.4s, v0.4h")  // sc0..3, 32-bit
		a.w("uxtl2 v13.4s, v0.8h") // sc4..7
	}
	scS := func(j int) string { return fmt.Sprintf("v%d.s[%d]", 12+j/4, j%4) }
	for p := range 4 { // sub-blocks 2p (low nibbles) and 2p+1 (high)
		a.raw("\t// sub-blocks %d and %d", 2*p, 2*p+1)
		a.g("ADD   $%d, R0, R12", 16+32*p)
		a.g("VLD1  (R12), [V8.B16, V9.B16]")
		a.w("and v4.16b, v8.16b, v31.16b")
		a.w("and v5.16b, v9.16b, v31.16b")
		a.w("ushr v6.16b, v8.16b, #4")
		a.w("ushr v7.16b, v9.16b, #4")
		for r := range k.rows {
			acc := fmt.Sprintf("v%d", 24+r)
			a.g("ADD   $%d, R%d, R12", 4+64*p, 1+r)
			a.g("VLD1  (R12), [V16.B16, V17.B16, V18.B16, V19.B16]")
			if k.dot {
				a.w("movi v10.2d, #0")
				a.w("movi v11.2d, #0")
				a.w("sdot v10.4s, v4.16b, v16.16b")
				a.w("sdot v10.4s, v5.16b, v17.16b")
				a.w("sdot v11.4s, v6.16b, v18.16b")
				a.w("sdot v11.4s, v7.16b, v19.16b")
				if p == 0 {
					a.w("mul %s.4s, v10.4s, %s", acc, scS(0))
				} else {
					a.w("mla %s.4s, v10.4s, %s", acc, scS(2*p))
				}
				a.w("mla %s.4s, v11.4s, %s", acc, scS(2*p+1))
				continue
			}
			a.w("smull v10.8h, v4.8b, v16.8b")
			a.w("smlal2 v10.8h, v4.16b, v16.16b")
			a.w("smlal v10.8h, v5.8b, v17.8b")
			a.w("smlal2 v10.8h, v5.16b, v17.16b")
			a.w("smull v11.8h, v6.8b, v18.8b")
			a.w("smlal2 v11.8h, v6.16b, v18.16b")
			a.w("smlal v11.8h, v7.8b, v19.8b")
			a.w("smlal2 v11.8h, v7.16b, v19.16b")
			if p == 0 {
				a.w("smull %s.4s, v10.4h, v0.h[0]", acc)
			} else {
				a.w("smlal %s.4s, v10.4h, v0.h[%d]", acc, 2*p)
			}
			a.w("smlal2 %s.4s, v10.8h, v0.h[%d]", acc, 2*p)
			a.w("smlal %s.4s, v11.4h, v0.h[%d]", acc, 2*p+1)
			a.w("smlal2 %s.4s, v11.8h, v0.h[%d]", acc, 2*p+1)
		}
	}
	a.raw("\t// mins term per row: bsums times the duplicated mins")
	for r := range k.rows {
		mp := fmt.Sprintf("v%d", 20+r)
		a.g("ADD   $260, R%d, R12", 1+r)
		a.g("VLD1  (R12), [V16.B16, V17.B16]")
		a.w("smull %s.4s, v16.4h, v2.4h", mp)
		a.w("smlal2 %s.4s, v16.8h, v2.8h", mp)
		a.w("smlal %s.4s, v17.4h, v3.4h", mp)
		a.w("smlal2 %s.4s, v17.8h, v3.8h", mp)
	}
	a.raw("\t// sumf += (d_w*d_a)*float32(isum); sumf -= (dmin_w*d_a)*float32(imin)")
	a.reduce(k.rows, 24, "v4", "v8")
	a.reduce(k.rows, 20, "v5", "v8")
	a.gatherD(k.rows, "v6")
	a.g("FMOVS (R0), F7")
	a.w("fcvtl v7.4s, v7.4h") // lane 0: d_w, lane 1: dmin_w (exact)
	a.w("fmul v8.4s, v6.4s, v7.s[0]")
	a.w("fmul v9.4s, v6.4s, v7.s[1]")
	a.w("scvtf v4.4s, v4.4s")
	a.w("scvtf v5.4s, v5.4s")
	a.w("fmul v4.4s, v8.4s, v4.4s")
	a.w("fadd v30.4s, v30.4s, v4.4s")
	a.w("fmul v5.4s, v9.4s, v5.4s")
	a.w("fsub v30.4s, v30.4s, v5.4s")
	a.blockTail(k)
	a.rowTail(k)
	a.raw("")
}

// q6K: block_q6_K (210 B: ql[128], qh[64], scales int8[16], d fp16 at 208)
// against block_q8_K.
func q6K(a *asm, k kernel) {
	if k.rows == 4 {
		a.raw("// func %s(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)", k.name())
		a.raw("// y[j*ys+r] = genericQ6KDot(w + r*rb, a_j, nb) for r < rows, j < 4")
		a.raw("// (rows, nb >= 1): each weight block is decoded once for the 4")
		a.raw("// activation rows.")
	} else {
		a.raw("// func %s(w, a *byte, nb, rows, rb int, out *float32)", k.name())
		a.raw("// out[r] = genericQ6KDot(w + r*rb, a, nb) for r < rows (rows, nb >= 1).")
	}
	a.raw("// Per block: the codes rebuilt from ql/qh as dequantize_row_q6_K does, minus")
	a.raw("// 32 (signed bytes -32..31, so the activation bsums are not read); isum =")
	if k.dot {
		a.raw("// sum_g sc_g * sum((q6-32)*q8) exactly (SDOT per 16-element group, times")
		a.raw("// the int8 scale with MLA); then sumf += (d_w*d_a)*float32(isum), lane r")
	} else {
		a.raw("// sum_g sc_g * sum((q6-32)*q8) exactly (16-bit pair sums, |.| <= 8192,")
		a.raw("// times the int8 scale with SMLAL by element); then")
		a.raw("// sumf += (d_w*d_a)*float32(isum) as q6KDotSums, lane r")
	}
	a.raw("// for row r.")
	a.prologue(k)
	a.w("movi v31.16b, #15")
	a.w("movi v29.16b, #48")
	a.w("movi v28.16b, #32")
	a.rowHead(k)
	a.raw("blockloop:")
	a.g("ADD   $192, R0, R12")
	a.g("VLD1  (R12), [V8.B16]")
	a.w("sxtl v0.8h, v8.8b")   // sc0..7
	a.w("sxtl2 v1.8h, v8.16b") // sc8..15
	if k.dot {
		a.w("sxtl v12.4s, v0.4h")
		a.w("sxtl2 v13.4s, v0.8h")
		a.w("sxtl v14.4s, v1.4h")
		a.w("sxtl2 v15.4s, v1.8h")
	}
	for n := range 2 {
		a.raw("\t// elements %d..%d: codes of groups %d..%d in V4..V11", 128*n, 128*n+127, 8*n, 8*n+7)
		a.g("ADD   $%d, R0, R12", 128+32*n)
		a.g("VLD1  (R12), [V16.B16, V17.B16]") // qh
		if n == 0 {
			a.g("VLD1  (R0), [V18.B16, V19.B16, V20.B16, V21.B16]") // ql
		} else {
			a.g("ADD   $64, R0, R12")
			a.g("VLD1  (R12), [V18.B16, V19.B16, V20.B16, V21.B16]")
		}
		type grp struct {
			ql, qh int    // registers
			lowNib bool   // ql & 15 (else ql >> 4)
			shift  string // qh to bits 4..5: "shl4", "shl2", "none", "shr2"
		}
		grps := []grp{
			{18, 16, true, "shl4"}, {19, 17, true, "shl4"},
			{20, 16, true, "shl2"}, {21, 17, true, "shl2"},
			{18, 16, false, "none"}, {19, 17, false, "none"},
			{20, 16, false, "shr2"}, {21, 17, false, "shr2"},
		}
		for g, c := range grps {
			d := 4 + g
			if c.lowNib {
				a.w("and v%d.16b, v%d.16b, v31.16b", d, c.ql)
			} else {
				a.w("ushr v%d.16b, v%d.16b, #4", d, c.ql)
			}
			switch c.shift {
			case "shl4":
				a.w("shl v22.16b, v%d.16b, #4", c.qh)
				a.w("and v22.16b, v22.16b, v29.16b")
			case "shl2":
				a.w("shl v22.16b, v%d.16b, #2", c.qh)
				a.w("and v22.16b, v22.16b, v29.16b")
			case "none":
				a.w("and v22.16b, v%d.16b, v29.16b", c.qh)
			case "shr2":
				a.w("ushr v22.16b, v%d.16b, #2", c.qh)
				a.w("and v22.16b, v22.16b, v29.16b")
			}
			a.w("orr v%d.16b, v%d.16b, v22.16b", d, d)
			a.w("sub v%d.16b, v%d.16b, v28.16b", d, d)
		}
		for r := range k.rows {
			acc := fmt.Sprintf("v%d", 24+r)
			for h := range 2 {
				a.g("ADD   $%d, R%d, R12", 4+128*n+64*h, 1+r)
				a.g("VLD1  (R12), [V16.B16, V17.B16, V18.B16, V19.B16]")
				for gi := range 4 {
					g := 4*h + gi
					i := 8*n + g // scale index
					code, y := fmt.Sprintf("v%d", 4+g), fmt.Sprintf("v%d", 16+gi)
					first := n == 0 && g == 0
					if k.dot {
						t := fmt.Sprintf("v%d", 20+gi%2)
						a.w("movi %s.2d, #0", t)
						a.w("sdot %s.4s, %s.16b, %s.16b", t, code, y)
						sc := fmt.Sprintf("v%d.s[%d]", 12+i/4, i%4)
						if first {
							a.w("mul %s.4s, %s.4s, %s", acc, t, sc)
						} else {
							a.w("mla %s.4s, %s.4s, %s", acc, t, sc)
						}
						continue
					}
					t := fmt.Sprintf("v%d", 20+gi%2)
					a.w("smull %s.8h, %s.8b, %s.8b", t, code, y)
					a.w("smlal2 %s.8h, %s.16b, %s.16b", t, code, y)
					sc := fmt.Sprintf("v%d.h[%d]", n, g)
					if first {
						a.w("smull %s.4s, %s.4h, %s", acc, t, sc)
					} else {
						a.w("smlal %s.4s, %s.4h, %s", acc, t, sc)
					}
					a.w("smlal2 %s.4s, %s.8h, %s", acc, t, sc)
				}
			}
		}
	}
	a.raw("\t// sumf += (d_w*d_a)*float32(isum)")
	a.reduce(k.rows, 24, "v4", "v5")
	a.gatherD(k.rows, "v6")
	a.g("MOVHU 208(R0), R12")
	a.g("FMOVS R12, F7")
	a.w("fcvtl v7.4s, v7.4h") // lane 0: d_w (exact)
	a.w("fmul v8.4s, v6.4s, v7.s[0]")
	a.w("scvtf v4.4s, v4.4s")
	a.w("fmul v4.4s, v8.4s, v4.4s")
	a.w("fadd v30.4s, v30.4s, v4.4s")
	a.blockTail(k)
	a.rowTail(k)
	a.raw("")
}

// q8Block accumulates into acc the int32 lane partials of one block_q8_0
// pair: weight codes in wl/wh, activation codes in yl/yh (exact).
func q8Block(a *asm, dot bool, acc, wl, wh, yl, yh string) {
	if dot {
		a.w("movi %s.2d, #0", acc)
		a.w("sdot %s.4s, %s.16b, %s.16b", acc, wl, yl)
		a.w("sdot %s.4s, %s.16b, %s.16b", acc, wh, yh)
		return
	}
	a.w("smull v12.8h, %s.8b, %s.8b", wl, yl)
	a.w("smull2 v13.8h, %s.16b, %s.16b", wl, yl)
	a.w("smull v14.8h, %s.8b, %s.8b", wh, yh)
	a.w("smull2 v15.8h, %s.16b, %s.16b", wh, yh)
	a.w("saddlp %s.4s, v12.8h", acc)
	a.w("sadalp %s.4s, v13.8h", acc)
	a.w("sadalp %s.4s, v14.8h", acc)
	a.w("sadalp %s.4s, v15.8h", acc)
}

// q8_0 4-row kernel: block_q8_0 (34 B: d fp16, qs int8[32]) on both sides.
func q8_0Rows4(a *asm, k kernel) {
	a.raw("// func %s(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)", k.name())
	a.raw("// y[j*ys+r] = genericQ8_0Dot(w + r*rb, a_j, nb) for r < rows, j < 4")
	a.raw("// (rows, nb >= 1). Per block: the exact int32 code product sum of each")
	if k.dot {
		a.raw("// row (SDOT), then sumf += (d_w*d_a)*float32(isum), lane r for row r.")
	} else {
		a.raw("// row (16-bit products, |p| <= 16384, widened pairwise: SADDLP/SADALP),")
		a.raw("// then sumf += (d_w*d_a)*float32(isum), lane r for row r.")
	}
	a.prologue(k)
	a.rowHead(k)
	a.raw("blockloop:")
	a.g("ADD   $2, R0, R12")
	a.g("VLD1  (R12), [V4.B16, V5.B16]")
	for r := range 4 {
		a.g("ADD   $2, R%d, R12", 1+r)
		a.g("VLD1  (R12), [V%d.B16, V%d.B16]", 16+2*r, 17+2*r)
		q8Block(a, k.dot, fmt.Sprintf("v%d", 24+r), "v4", "v5", fmt.Sprintf("v%d", 16+2*r), fmt.Sprintf("v%d", 17+2*r))
	}
	a.raw("\t// sumf += (d_w*d_a)*float32(isum)")
	a.reduce(4, 24, "v6", "v7")
	for r := range 4 {
		a.w("ld1 {v7.h}[%d], [x%d]", r, 1+r)
	}
	a.w("fcvtl v7.4s, v7.4h") // d_a of each row (exact)
	a.g("MOVHU (R0), R12")
	a.g("FMOVS R12, F8")
	a.w("fcvtl v8.4s, v8.4h") // lane 0: d_w
	a.w("fmul v7.4s, v7.4s, v8.s[0]")
	a.w("scvtf v6.4s, v6.4s")
	a.w("fmul v6.4s, v7.4s, v6.4s")
	a.w("fadd v30.4s, v30.4s, v6.4s")
	a.blockTail(k)
	a.rowTail(k)
	a.raw("")
}

// q8_0 1-row kernel: 4 blocks at a time (their sums reduced together and the
// 4 products (d_w*d_a)*float32(isum) computed packed, lane b = block b),
// added to sumf one at a time in block order, then single blocks.
func q8_0Rows1(a *asm, k kernel) {
	a.raw("// func %s(w, a *byte, nb, rows, rb int, out *float32)", k.name())
	a.raw("// out[r] = genericQ8_0Dot(w + r*rb, a, nb) for r < rows (rows, nb >= 1).")
	a.raw("// Blocks go 4 at a time: exact int32 sums (%s), the 4 products",
		map[bool]string{true: "SDOT", false: "16-bit products widened pairwise"}[k.dot])
	a.raw("// (d_w*d_a)*float32(isum) computed packed (lane b: block b), then added to")
	a.raw("// sumf one lane at a time in block order; the nb%%4 last blocks one by one.")
	a.prologue(k)
	a.rowHead(k)
	a.raw("quad:")
	a.g("CMP   $4, R5")
	a.g("BLT   single")
	for b := range 4 {
		a.g("ADD   $%d, R0, R12", 2+34*b)
		a.g("VLD1  (R12), [V%d.B16, V%d.B16]", 4+2*b, 5+2*b)
		a.g("ADD   $%d, R1, R12", 2+34*b)
		a.g("VLD1  (R12), [V%d.B16, V%d.B16]", 16+2*b, 17+2*b)
		q8Block(a, k.dot, fmt.Sprintf("v%d", 24+b),
			fmt.Sprintf("v%d", 4+2*b), fmt.Sprintf("v%d", 5+2*b),
			fmt.Sprintf("v%d", 16+2*b), fmt.Sprintf("v%d", 17+2*b))
	}
	a.reduce(4, 24, "v12", "v13")
	for b := range 4 {
		a.g("ADD   $%d, R0, R12", 34*b)
		a.w("ld1 {v13.h}[%d], [x12]", b)
		a.g("ADD   $%d, R1, R12", 34*b)
		a.w("ld1 {v14.h}[%d], [x12]", b)
	}
	a.w("fcvtl v13.4s, v13.4h") // d_w of the 4 blocks
	a.w("fcvtl v14.4s, v14.4h") // d_a
	a.w("fmul v13.4s, v13.4s, v14.4s")
	a.w("scvtf v12.4s, v12.4s")
	a.w("fmul v12.4s, v13.4s, v12.4s")
	a.w("fadd s30, s30, s12")
	for b := 1; b < 4; b++ {
		a.w("mov s15, v12.s[%d]", b)
		a.w("fadd s30, s30, s15")
	}
	a.g("ADD   $136, R0")
	a.g("ADD   $136, R1")
	a.g("SUB   $4, R5")
	a.g("B     quad")
	a.raw("single:")
	a.g("CBZ   R5, rowdone")
	a.g("ADD   $2, R0, R12")
	a.g("VLD1  (R12), [V4.B16, V5.B16]")
	a.g("ADD   $2, R1, R12")
	a.g("VLD1  (R12), [V16.B16, V17.B16]")
	q8Block(a, k.dot, "v24", "v4", "v5", "v16", "v17")
	a.w("addv s12, v24.4s")
	a.w("scvtf s12, s12")
	a.g("MOVHU (R0), R12")
	a.g("FMOVS R12, F13")
	a.w("fcvt s13, h13")
	a.g("MOVHU (R1), R12")
	a.g("FMOVS R12, F14")
	a.w("fcvt s14, h14")
	a.w("fmul s13, s13, s14")
	a.w("fmul s12, s13, s12")
	a.w("fadd s30, s30, s12")
	a.g("ADD   $34, R0")
	a.g("ADD   $34, R1")
	a.g("SUB   $1, R5")
	a.g("B     single")
	a.raw("rowdone:")
	a.rowTail(k)
	a.raw("")
}

// dotF32Rows: DotF32 of x against rows of m.
func dotF32Rows(a *asm) {
	a.raw("// func dotF32RowsNEON(x, m *float32, n, rows, stride int, out *float32)")
	a.raw("// out[j] = DotF32(x[:n], m[j*stride:][:n]) for j < rows (rows >= 1, n >= 0,")
	a.raw("// stride in floats): genericDotF32's 32 lanes (lane l: elements i%%32 == l,")
	a.raw("// acc += x*m with FMUL then FADD) in V0..V7, the n%%32 tail elements added")
	a.raw("// to their lanes one by one through the frame (scalar FMUL, FADD), then")
	a.raw("// reduceLanes' tree: acc[i] += acc[i+w] for w = 16, 8, 4, 2, 1.")
	a.raw("TEXT ·dotF32RowsNEON(SB), NOSPLIT, $128-48")
	a.g("MOVD x+0(FP), R10")
	a.g("MOVD m+8(FP), R11")
	a.g("MOVD n+16(FP), R2")
	a.g("MOVD rows+24(FP), R6")
	a.g("MOVD stride+32(FP), R7")
	a.g("LSL  $2, R7, R7")
	a.g("MOVD out+40(FP), R8")
	a.raw("rowloop:")
	a.g("MOVD R10, R0")
	a.g("MOVD R11, R1")
	for v := range 8 {
		a.w("movi v%d.2d, #0", v)
	}
	a.g("LSR  $5, R2, R3")
	a.g("CBZ  R3, tail")
	a.raw("loop32:")
	a.g("VLD1.P 64(R0), [V16.S4, V17.S4, V18.S4, V19.S4]")
	a.g("VLD1.P 64(R0), [V20.S4, V21.S4, V22.S4, V23.S4]")
	a.g("VLD1.P 64(R1), [V24.S4, V25.S4, V26.S4, V27.S4]")
	a.g("VLD1.P 64(R1), [V28.S4, V29.S4, V30.S4, V31.S4]")
	for v := range 8 {
		a.w("fmul v%d.4s, v%d.4s, v%d.4s", 16+v, 16+v, 24+v)
	}
	for v := range 8 {
		a.w("fadd v%d.4s, v%d.4s, v%d.4s", v, v, 16+v)
	}
	a.g("SUBS $1, R3, R3")
	a.g("BNE  loop32")
	a.raw("tail:")
	a.g("ANDS $31, R2, R3")
	a.g("BEQ  reduce")
	a.g("ADD  $8, RSP, R12")
	a.g("VST1 [V0.S4, V1.S4, V2.S4, V3.S4], (R12)")
	a.g("ADD  $64, R12, R13")
	a.g("VST1 [V4.S4, V5.S4, V6.S4, V7.S4], (R13)")
	a.raw("tailloop:")
	a.g("FMOVS.P 4(R0), F16")
	a.g("FMOVS.P 4(R1), F17")
	a.w("fmul s16, s16, s17")
	a.g("FMOVS (R12), F18")
	a.w("fadd s18, s18, s16")
	a.g("FMOVS.P F18, 4(R12)")
	a.g("SUBS $1, R3, R3")
	a.g("BNE  tailloop")
	a.g("ADD  $8, RSP, R12")
	a.g("VLD1 (R12), [V0.S4, V1.S4, V2.S4, V3.S4]")
	a.g("VLD1 (R13), [V4.S4, V5.S4, V6.S4, V7.S4]")
	a.raw("reduce:")
	a.reduce32()
	a.g("FMOVS F0, (R8)")
	a.g("ADD  $4, R8")
	a.g("ADD  R7, R11, R11")
	a.g("SUBS $1, R6, R6")
	a.g("BNE  rowloop")
	a.g("RET")
	a.raw("")
}

// dotH16Lanes: 32 float32 lanes of fp16 (or bf16) products, as
// dotF32LanesNEON after an exact widening of both rows.
func dotH16Lanes(a *asm, name string, bf bool) {
	kind, widen := "fp16", "FCVTL/FCVTL2"
	if bf {
		kind, widen = "bf16", "SHLL/SHLL2 #16"
	}
	a.raw("// func %s(w, a *byte, n int, acc *[32]float32)", name)
	a.raw("// acc[l] += float32(w[i]*a[i]) for i%%32 == l over two %s rows of n", kind)
	a.raw("// elements (n a multiple of 32, >= 32): both widened to float32 exactly")
	a.raw("// (%s), then FMUL and FADD per lane (lanes 4k..4k+3 in V<k>).", widen)
	a.raw("TEXT ·%s(SB), NOSPLIT, $0-32", name)
	a.g("MOVD w+0(FP), R0")
	a.g("MOVD a+8(FP), R1")
	a.g("MOVD n+16(FP), R2")
	a.g("MOVD acc+24(FP), R3")
	a.g("VLD1 (R3), [V0.S4, V1.S4, V2.S4, V3.S4]")
	a.g("ADD  $64, R3, R4")
	a.g("VLD1 (R4), [V4.S4, V5.S4, V6.S4, V7.S4]")
	a.g("LSR  $5, R2, R2")
	a.raw("loop:")
	a.g("VLD1.P 64(R0), [V8.B16, V9.B16, V10.B16, V11.B16]")
	a.g("VLD1.P 64(R1), [V12.B16, V13.B16, V14.B16, V15.B16]")
	for i := range 4 {
		for j, base := range []int{16, 24} { // w lanes to V16.., a lanes to V24..
			src := 8 + 4*j + i
			lo, hi := base+2*i, base+2*i+1
			if bf {
				a.w("shll v%d.4s, v%d.4h, #16", lo, src)
				a.w("shll2 v%d.4s, v%d.8h, #16", hi, src)
			} else {
				a.w("fcvtl v%d.4s, v%d.4h", lo, src)
				a.w("fcvtl2 v%d.4s, v%d.8h", hi, src)
			}
		}
	}
	for v := range 8 {
		a.w("fmul v%d.4s, v%d.4s, v%d.4s", 16+v, 16+v, 24+v)
	}
	for v := range 8 {
		a.w("fadd v%d.4s, v%d.4s, v%d.4s", v, v, 16+v)
	}
	a.g("SUBS $1, R2, R2")
	a.g("BNE  loop")
	a.g("VST1 [V0.S4, V1.S4, V2.S4, V3.S4], (R3)")
	a.g("VST1 [V4.S4, V5.S4, V6.S4, V7.S4], (R4)")
	a.g("RET")
	a.raw("")
}

// reduce32 leaves in s0 the sum of the 32 lanes of V0..V7 with
// reduceLanes' tree (acc[i] += acc[i+w] for w = 16, 8, 4, 2, 1); clobbers
// V0..V3.
func (a *asm) reduce32() {
	a.w("fadd v0.4s, v0.4s, v4.4s")
	a.w("fadd v1.4s, v1.4s, v5.4s")
	a.w("fadd v2.4s, v2.4s, v6.4s")
	a.w("fadd v3.4s, v3.4s, v7.4s")
	a.w("fadd v0.4s, v0.4s, v2.4s")
	a.w("fadd v1.4s, v1.4s, v3.4s")
	a.w("fadd v0.4s, v0.4s, v1.4s")
	a.w("ext v1.16b, v0.16b, v0.16b, #8")
	a.w("fadd v0.4s, v0.4s, v1.4s") // lanes 0, 1: a0+a2, a1+a3
	a.w("faddp s0, v0.2s")
}

// deltaRule: genericDeltaRule for n a multiple of 32.
func deltaRule(a *asm) {
	a.raw("// func deltaRuleNEON(st, q, k, v, o *float32, n, rows int, beta, decay, scale float32)")
	a.raw("// genericDeltaRule for rows >= 1 state rows of n floats, n a multiple of 32")
	a.raw("// (>= 32). Per row j: pass 1 scales the row by decay (stored) and sums its")
	a.raw("// products with k in DotF32's 32 lanes (V0..V7); d = (v[j]-dot)*beta;")
	a.raw("// pass 2 adds float32(k*d) to the row (stored) and sums its products with")
	a.raw("// q; o[j] = dot*scale. Every multiply and add is its own FMUL / FADD.")
	a.raw("TEXT ·deltaRuleNEON(SB), NOSPLIT, $0-68")
	a.g("MOVD  st+0(FP), R0")
	a.g("MOVD  q+8(FP), R11")
	a.g("MOVD  k+16(FP), R10")
	a.g("MOVD  v+24(FP), R4")
	a.g("MOVD  o+32(FP), R5")
	a.g("MOVD  n+40(FP), R7")
	a.g("LSR   $5, R7, R7")
	a.g("MOVD  rows+48(FP), R6")
	a.g("FMOVS beta+56(FP), F29")
	a.g("FMOVS decay+60(FP), F28")
	a.g("FMOVS scale+64(FP), F30")
	a.w("dup v28.4s, v28.s[0]")
	a.raw("rowloop:")
	a.g("MOVD  R0, R13")
	a.g("MOVD  R10, R1")
	a.g("MOVD  R7, R8")
	for v := range 8 {
		a.w("movi v%d.2d, #0", v)
	}
	a.raw("pass1:")
	a.g("VLD1  (R0), [V16.S4, V17.S4, V18.S4, V19.S4]")
	a.g("ADD   $64, R0, R12")
	a.g("VLD1  (R12), [V20.S4, V21.S4, V22.S4, V23.S4]")
	for v := range 8 {
		a.w("fmul v%d.4s, v%d.4s, v28.4s", 16+v, 16+v)
	}
	a.g("VST1.P [V16.S4, V17.S4, V18.S4, V19.S4], 64(R0)")
	a.g("VST1.P [V20.S4, V21.S4, V22.S4, V23.S4], 64(R0)")
	a.g("VLD1.P 64(R1), [V8.S4, V9.S4, V10.S4, V11.S4]")
	a.g("VLD1.P 64(R1), [V12.S4, V13.S4, V14.S4, V15.S4]")
	for v := range 8 {
		a.w("fmul v%d.4s, v%d.4s, v%d.4s", 16+v, 16+v, 8+v)
	}
	for v := range 8 {
		a.w("fadd v%d.4s, v%d.4s, v%d.4s", v, v, 16+v)
	}
	a.g("SUBS  $1, R8, R8")
	a.g("BNE   pass1")
	a.reduce32()
	a.g("FMOVS.P 4(R4), F1")
	a.w("fsub s1, s1, s0")
	a.w("fmul s1, s1, s29") // d = (v[j] - dot) * beta
	a.w("dup v31.4s, v1.s[0]")
	a.g("MOVD  R13, R0")
	a.g("MOVD  R10, R1")
	a.g("MOVD  R11, R2")
	a.g("MOVD  R7, R8")
	for v := range 8 {
		a.w("movi v%d.2d, #0", v)
	}
	a.raw("pass2:")
	a.g("VLD1.P 64(R1), [V8.S4, V9.S4, V10.S4, V11.S4]")
	a.g("VLD1.P 64(R1), [V12.S4, V13.S4, V14.S4, V15.S4]")
	a.g("VLD1  (R0), [V16.S4, V17.S4, V18.S4, V19.S4]")
	a.g("ADD   $64, R0, R12")
	a.g("VLD1  (R12), [V20.S4, V21.S4, V22.S4, V23.S4]")
	for v := range 8 {
		a.w("fmul v%d.4s, v%d.4s, v31.4s", 8+v, 8+v) // k*d
	}
	for v := range 8 {
		a.w("fadd v%d.4s, v%d.4s, v%d.4s", 16+v, 16+v, 8+v)
	}
	a.g("VST1.P [V16.S4, V17.S4, V18.S4, V19.S4], 64(R0)")
	a.g("VST1.P [V20.S4, V21.S4, V22.S4, V23.S4], 64(R0)")
	a.g("VLD1.P 64(R2), [V8.S4, V9.S4, V10.S4, V11.S4]")
	a.g("VLD1.P 64(R2), [V12.S4, V13.S4, V14.S4, V15.S4]")
	for v := range 8 {
		a.w("fmul v%d.4s, v%d.4s, v%d.4s", 16+v, 16+v, 8+v)
	}
	for v := range 8 {
		a.w("fadd v%d.4s, v%d.4s, v%d.4s", v, v, 16+v)
	}
	a.g("SUBS  $1, R8, R8")
	a.g("BNE   pass2")
	a.reduce32()
	a.w("fmul s0, s0, s30")
	a.g("FMOVS.P F0, 4(R5)")
	a.g("SUBS  $1, R6, R6")
	a.g("BNE   rowloop")
	a.g("RET")
	a.raw("")
}

func main() {
	a := &asm{words: map[string]bool{}}
	a.raw("// Code generated by neon_gen.go; DO NOT EDIT.")
	a.raw("")
	a.raw("//go:build !noasm")
	a.raw("")
	a.raw("// Multi-row NEON kernels of package quant: see kernels_arm64.go for the")
	a.raw("// contracts and neon_gen.go for how the WORDs were encoded (llvm-mc; the")
	a.raw("// Arm text follows each). Integer sums are exact; float steps are single")
	a.raw("// FMUL/FADD/FSUB/SCVTF/FCVT (never FMLA) in the pure-Go order, lane r of a")
	a.raw("// vector being activation row r's scalar step.")
	a.raw("")
	a.raw("#include \"textflag.h\"")
	a.raw("")
	for _, dot := range []bool{false, true} {
		for _, rows := range []int{1, 4} {
			q4K(a, kernel{"q4K", rows, dot, 144, 292})
			q6K(a, kernel{"q6K", rows, dot, 210, 292})
			if rows == 4 {
				q8_0Rows4(a, kernel{"q8_0", rows, dot, 34, 34})
			} else {
				q8_0Rows1(a, kernel{"q8_0", rows, dot, 34, 34})
			}
		}
	}
	dotF32Rows(a)
	dotH16Lanes(a, "dotF16LanesNEON", false)
	dotH16Lanes(a, "dotBF16LanesNEON", true)
	deltaRule(a)
	a.finish("kernels_rows_arm64.s")
}
