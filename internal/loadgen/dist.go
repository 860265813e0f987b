package loadgen

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
)

// Zipf picks one recipient with probability proportional to 1/rank^S
// (rank 1 is Users[0]), the recipient distribution of the Porcupine
// evaluation. S = 1 is the classic skew; S = 0 is uniform; a large S
// sends nearly everything to the first few users. Unlike math/rand's Zipf
// it accepts any S >= 0, including 1.
//
// Build it with NewZipf: picking is a binary search over a precomputed
// cumulative table (8 octets per user), and the table is read-only, so one
// Zipf may be shared by every worker.
type Zipf struct {
	Users []string
	S     float64
	cdf   []float64 // cdf[i] = P(rank <= i+1); cdf[len-1] == 1
}

// NewZipf returns a Zipf over users with exponent s.
func NewZipf(users []string, s float64) (*Zipf, error) {
	if len(users) == 0 {
		return nil, fmt.Errorf("loadgen: zipf over no users")
	}
	if s < 0 || math.IsNaN(s) || math.IsInf(s, 0) {
		return nil, fmt.Errorf("loadgen: zipf exponent %v: want a finite s >= 0", s)
	}
	cdf := make([]float64, len(users))
	sum := 0.0
	for i := range cdf {
		sum += math.Pow(float64(i+1), -s)
		cdf[i] = sum
	}
	for i := range cdf {
		cdf[i] /= sum
	}
	cdf[len(cdf)-1] = 1
	return &Zipf{Users: users, S: s, cdf: cdf}, nil
}

// Rank draws a 0-based rank.
func (z *Zipf) Rank(r *rand.Rand) int {
	u := r.Float64()
	// Rank i owns (cdf[i-1], cdf[i]]: the first cdf[i] >= u.
	return min(sort.SearchFloat64s(z.cdf, u), len(z.cdf)-1)
}

// Prob returns the probability of 0-based rank i.
func (z *Zipf) Prob(i int) float64 {
	if i == 0 {
		return z.cdf[0]
	}
	return z.cdf[i] - z.cdf[i-1]
}

// Pick implements RecipientPicker.
func (z *Zipf) Pick(r *rand.Rand, dst []string) []string {
	return append(dst, z.Users[z.Rank(r)])
}

// LogNormal draws sizes whose logarithm is normal, with the given Mean (in
// octets) and Sigma (the standard deviation of the logarithm), clamped to
// [Min, Max]. The Porcupine workload is Mean 4700 with a tail reaching
// about 1 MB: DefaultLogNormal.
type LogNormal struct {
	Mean  float64
	Sigma float64
	Min   int
	Max   int
}

// DefaultLogNormal is the Porcupine size distribution: mean 4.7 KB;
// sigma 1.3 puts the median near 2 KB, one message in 1,000 above 100 KB
// and one in 100,000 near 1 MB, where it is capped.
var DefaultLogNormal = LogNormal{Mean: 4700, Sigma: 1.3, Min: 300, Max: 1 << 20}

// Size implements SizeDist.
func (l LogNormal) Size(r *rand.Rand) int {
	mu := math.Log(l.Mean) - l.Sigma*l.Sigma/2 // E[X] = exp(mu + sigma^2/2)
	v := math.Exp(mu + l.Sigma*r.NormFloat64())
	if v > float64(l.Max) {
		return l.Max
	}
	return max(int(v), l.Min)
}

// UniformSize draws sizes uniformly from [Min, Max].
type UniformSize struct{ Min, Max int }

// Size implements SizeDist.
func (u UniformSize) Size(r *rand.Rand) int { return u.Min + r.IntN(u.Max-u.Min+1) }

// maxGenSize bounds a generated message: far above any preset, far below
// what would exhaust the generator's memory.
const maxGenSize = 64 << 20

// ParseSizeDist parses a size distribution:
//
//	lognormal                   DefaultLogNormal
//	lognormal:MEAN[:SIGMA[:MAX]]
//	fixed:SIZE
//	uniform:MIN-MAX
//	cassmail-small              uniform:50K-500K (CassMail's range)
//	cassmail-large              uniform:200K-2M
//
// Sizes are octets with an optional K (1,000) or M (1,000,000) suffix.
func ParseSizeDist(s string) (SizeDist, error) {
	kind, arg, _ := strings.Cut(s, ":")
	bad := func(why string) (SizeDist, error) {
		return nil, fmt.Errorf("loadgen: size distribution %q: %s", s, why)
	}
	switch kind {
	case "cassmail-small", "cassmail-large":
		if arg != "" {
			return bad("takes no arguments")
		}
		if kind == "cassmail-small" {
			return UniformSize{50_000, 500_000}, nil
		}
		return UniformSize{200_000, 2_000_000}, nil
	case "fixed":
		n, err := parseSize(arg)
		if err != nil {
			return bad(err.Error())
		}
		return FixedSize(n), nil
	case "uniform":
		lo, hi, ok := strings.Cut(arg, "-")
		if !ok {
			return bad("want uniform:MIN-MAX")
		}
		a, err := parseSize(lo)
		if err != nil {
			return bad(err.Error())
		}
		b, err := parseSize(hi)
		if err != nil {
			return bad(err.Error())
		}
		if a > b {
			return bad("MIN above MAX")
		}
		return UniformSize{a, b}, nil
	case "lognormal":
		l := DefaultLogNormal
		if arg == "" {
			return l, nil
		}
		parts := strings.Split(arg, ":")
		if len(parts) > 3 {
			return bad("want lognormal:MEAN[:SIGMA[:MAX]]")
		}
		mean, err := parseSize(parts[0])
		if err != nil || mean == 0 {
			return bad("MEAN must be a positive size")
		}
		l.Mean = float64(mean)
		if len(parts) > 1 {
			sigma, err := strconv.ParseFloat(parts[1], 64)
			if err != nil || !(sigma >= 0 && sigma <= 4) {
				return bad("SIGMA must be a number in [0, 4]")
			}
			l.Sigma = sigma
		}
		if len(parts) > 2 {
			m, err := parseSize(parts[2])
			if err != nil {
				return bad(err.Error())
			}
			l.Max = m
		}
		if l.Max < l.Min || float64(l.Max) < l.Mean {
			return bad("MAX below MEAN")
		}
		return l, nil
	}
	return bad("unknown kind (lognormal, fixed, uniform, cassmail-small, cassmail-large)")
}

// parseSize parses octets with an optional K or M suffix, at most maxGenSize.
func parseSize(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult, s = 1_000, s[:len(s)-1]
	case strings.HasSuffix(s, "M"):
		mult, s = 1_000_000, s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > maxGenSize/mult {
		return 0, fmt.Errorf("size %q: want 0..%d octets, optionally with K or M", s, maxGenSize)
	}
	return n * mult, nil
}
