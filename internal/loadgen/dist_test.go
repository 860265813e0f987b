package loadgen

import (
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// The statistical tests draw from fixed seeds, so they are deterministic;
// their bounds are several standard errors wide, so a correct
// implementation passes for any seed and a wrong one (an off-by-one rank,
// a wrong mu) fails.

func TestZipfMatchesItsLaw(t *testing.T) {
	const n, draws = 10_000, 400_000
	users := UserNames("example.test", n)
	for _, s := range []float64{0, 1, 1.5} {
		z, err := NewZipf(users, s)
		if err != nil {
			t.Fatal(err)
		}
		// The law itself: P(rank k) proportional to 1/k^s.
		h := 0.0
		for k := 1; k <= n; k++ {
			h += math.Pow(float64(k), -s)
		}
		for _, k := range []int{1, 2, 10, n} {
			want := math.Pow(float64(k), -s) / h
			if got := z.Prob(k - 1); math.Abs(got-want) > 1e-12 {
				t.Fatalf("s=%v: Prob(rank %d) = %v, want %v", s, k, got, want)
			}
		}
		r := rand.New(rand.NewPCG(7, uint64(s*10)))
		counts := make([]int, n)
		for range draws {
			counts[z.Rank(r)]++
		}
		// Each of the ten most popular ranks within 5 standard errors.
		for k := 0; k < 10; k++ {
			p := z.Prob(k)
			sd := math.Sqrt(draws * p * (1 - p))
			if d := math.Abs(float64(counts[k]) - draws*p); d > 5*sd+1 {
				t.Errorf("s=%v rank %d: %d draws, want %.0f ± %.0f", s, k+1, counts[k], draws*p, 5*sd)
			}
		}
		// The tail as a whole: ranks above 100.
		pTail, cTail := 0.0, 0
		for k := 100; k < n; k++ {
			pTail += z.Prob(k)
			cTail += counts[k]
		}
		sd := math.Sqrt(draws * pTail * (1 - pTail))
		if d := math.Abs(float64(cTail) - draws*pTail); d > 5*sd+1 {
			t.Errorf("s=%v tail: %d draws, want %.0f ± %.0f", s, cTail, draws*pTail, 5*sd)
		}
	}
}

func TestZipfSkewKnob(t *testing.T) {
	users := UserNames("example.test", 10_000)
	z, err := NewZipf(users, 8)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	first := 0
	for range 10_000 {
		if z.Pick(r, nil)[0] == users[0] {
			first++
		}
	}
	if first < 9_900 {
		t.Errorf("s=8 sent %d of 10000 to the first user, want nearly all", first)
	}
	if _, err := NewZipf(users, -1); err == nil {
		t.Error("negative exponent accepted")
	}
	if _, err := NewZipf(nil, 1); err == nil {
		t.Error("empty population accepted")
	}
}

func TestLogNormalSizes(t *testing.T) {
	const draws = 400_000
	l := DefaultLogNormal
	r := rand.New(rand.NewPCG(3, 4))
	sizes := make([]int, draws)
	sum := 0.0
	for i := range sizes {
		sizes[i] = l.Size(r)
		sum += float64(sizes[i])
	}
	mean := sum / draws
	// sigma 1.3: the standard error of the mean is about 0.35%.
	if math.Abs(mean-4700) > 0.03*4700 {
		t.Errorf("mean %.0f, want 4700 ± 3%%", mean)
	}
	sort.Ints(sizes)
	median := sizes[draws/2]
	wantMedian := 4700 * math.Exp(-1.3*1.3/2)
	if math.Abs(float64(median)-wantMedian) > 0.03*wantMedian {
		t.Errorf("median %d, want %.0f ± 3%%", median, wantMedian)
	}
	if sizes[0] < l.Min || sizes[draws-1] > l.Max {
		t.Errorf("sizes span [%d, %d], outside [%d, %d]", sizes[0], sizes[draws-1], l.Min, l.Max)
	}
	// The fat tail: P(> 100 KB) is about 1e-3, so ~400 draws; P(> 300 KB)
	// is about 5e-5.
	over100K := draws - sort.SearchInts(sizes, 100_001)
	if over100K < 200 || over100K > 800 {
		t.Errorf("%d sizes above 100 KB, want about 400", over100K)
	}
	if sizes[draws-1] < 300_000 {
		t.Errorf("largest size %d: the tail does not reach 300 KB", sizes[draws-1])
	}
}

func TestUniformSize(t *testing.T) {
	u := UniformSize{50_000, 500_000}
	r := rand.New(rand.NewPCG(5, 6))
	const draws = 100_000
	sum := 0.0
	for range draws {
		v := u.Size(r)
		if v < u.Min || v > u.Max {
			t.Fatalf("size %d outside [%d, %d]", v, u.Min, u.Max)
		}
		sum += float64(v)
	}
	// Standard error of the mean: 450000/sqrt(12)/sqrt(1e5) ≈ 411.
	if mean := sum / draws; math.Abs(mean-275_000) > 2_500 {
		t.Errorf("mean %.0f, want 275000", mean)
	}
}

func TestParseSizeDist(t *testing.T) {
	for in, want := range map[string]SizeDist{
		"lognormal":             DefaultLogNormal,
		"lognormal:10K":         LogNormal{Mean: 10_000, Sigma: 1.3, Min: 300, Max: 1 << 20},
		"lognormal:4700:1:500K": LogNormal{Mean: 4700, Sigma: 1, Min: 300, Max: 500_000},
		"fixed:4700":            FixedSize(4700),
		"fixed:2M":              FixedSize(2_000_000),
		"uniform:50K-500K":      UniformSize{50_000, 500_000},
		"cassmail-small":        UniformSize{50_000, 500_000},
		"cassmail-large":        UniformSize{200_000, 2_000_000},
	} {
		got, err := ParseSizeDist(in)
		if err != nil || got != want {
			t.Errorf("ParseSizeDist(%q) = %#v, %v; want %#v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "fixed", "fixed:-1", "fixed:1G", "fixed:68M", "uniform:5-1", "uniform:5",
		"lognormal:0", "lognormal:4700:9", "lognormal:4700:1:1K", "lognormal:1:1:1:1", "cassmail-small:1", "zipf"} {
		if d, err := ParseSizeDist(in); err == nil {
			t.Errorf("ParseSizeDist(%q) = %#v, want an error", in, d)
		}
	}
}

func FuzzParseSizeDist(f *testing.F) {
	for _, s := range []string{"lognormal", "lognormal:4700:1.3:1M", "fixed:10K", "uniform:1-2", "cassmail-large", "uniform:-", "fixed:9999999999999999999K"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseSizeDist(s)
		if err != nil {
			return
		}
		r := rand.New(rand.NewPCG(1, 1))
		for range 100 {
			if n := d.Size(r); n < 0 || n > maxGenSize {
				t.Fatalf("%q drew size %d", s, n)
			}
		}
	})
}
