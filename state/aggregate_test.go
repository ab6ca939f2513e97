package state_test

import (
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/eoskit/eoskit/state"
)

func TestCountAndSumStoreDecimalText(t *testing.T) {
	s := state.NewMemory()
	tx := state.NewTxn(s, 0)
	for range 3 {
		if _, err := state.Count(tx, []byte("k")); err != nil {
			t.Fatal(err)
		}
	}
	n, err := state.Sum(tx, []byte("k"), -5)
	if err != nil || n != -2 {
		t.Fatalf("Sum = %d, %v; want -2", n, err)
	}
	if v, _ := get(t, tx, "k"); v != "-2" {
		t.Fatalf("stored %q, want the decimal text -2", v)
	}
	if got, err := state.Int64([]byte("-2")); err != nil || got != -2 {
		t.Fatalf("Int64 = %d, %v", got, err)
	}
	for _, bad := range []string{"", " 1", "1.0", "0x10", "99999999999999999999"} {
		if _, err := state.Int64([]byte(bad)); !errors.Is(err, state.ErrNotInt64) {
			t.Errorf("Int64(%q): %v", bad, err)
		}
	}
}

func TestSumRefusesOverflowAndValuesThatAreNoCount(t *testing.T) {
	tx := state.NewTxn(state.NewMemory(), 0)
	must(t, tx.Put([]byte("max"), state.AppendInt64(nil, math.MaxInt64)))
	if _, err := state.Count(tx, []byte("max")); !errors.Is(err, state.ErrOverflow) {
		t.Fatalf("overflow: %v", err)
	}
	must(t, tx.Put([]byte("min"), state.AppendInt64(nil, math.MinInt64)))
	if _, err := state.Sum(tx, []byte("min"), -1); !errors.Is(err, state.ErrOverflow) {
		t.Fatalf("underflow: %v", err)
	}
	if v, _ := get(t, tx, "max"); v != "9223372036854775807" {
		t.Fatalf("an overflowing Sum wrote %q", v)
	}
	must(t, tx.Put([]byte("text"), []byte("hello")))
	if _, err := state.Count(tx, []byte("text")); !errors.Is(err, state.ErrNotInt64) {
		t.Fatalf("count of text: %v", err)
	}
}

func TestReduceKeepsOrDeletes(t *testing.T) {
	tx := state.NewTxn(state.NewMemory(), 0)
	longest := func(old, v []byte) []byte {
		if len(v) > len(old) {
			return v
		}
		return old
	}
	for _, v := range []string{"ab", "a", "abcd", "abc"} {
		if _, err := state.Reduce(tx, []byte("k"), []byte(v), longest); err != nil {
			t.Fatal(err)
		}
	}
	if v, _ := get(t, tx, "k"); v != "abcd" {
		t.Fatalf("k = %q", v)
	}
	if _, err := state.Reduce(tx, []byte("k"), nil, func(_, _ []byte) []byte { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, ok := get(t, tx, "k"); ok {
		t.Fatal("a reducer's nil did not delete")
	}
}

// However many inputs change a key in a transaction, its output is one
// record with the final value.
func TestUpdatesEmitOneRecordPerChangedKey(t *testing.T) {
	tx := state.NewTxn(state.NewMemory(), 0)
	for _, k := range []string{"b", "a", "b", "b", "a", "c"} {
		if _, err := state.Count(tx, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	must(t, tx.Delete([]byte("c")))
	recs := state.Updates(tx.Dirty(), "counts")
	var got []string
	for _, r := range recs {
		v := string(r.Value)
		if r.Value == nil {
			v = "<tombstone>"
		}
		if r.Topic != "counts" {
			t.Fatalf("topic %q", r.Topic)
		}
		got = append(got, string(r.Key)+"="+v)
	}
	if want := "[a=2 b=3 c=<tombstone>]"; fmtSlice(got) != want {
		t.Fatalf("updates %v, want %s", got, want)
	}
}

func fmtSlice(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out + "]"
}

// Int64 decodes what strconv.ParseInt decodes, and fails where it fails,
// whatever the input: its short path (up to 18 digits) must not differ.
func FuzzInt64AgreesWithStrconv(f *testing.F) {
	for _, s := range []string{"0", "-0", "+7", "007", "-", "+", "", "12a", "999999999999999999", "-999999999999999999",
		"9223372036854775807", "-9223372036854775808", "9223372036854775808", "1000000000000000000", "1_000", " 1", "１"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		want, wantErr := strconv.ParseInt(string(v), 10, 64)
		got, err := state.Int64(v)
		if (err != nil) != (wantErr != nil) || err == nil && got != want {
			t.Fatalf("Int64(%q) = %d, %v; strconv: %d, %v", v, got, err, want, wantErr)
		}
		if err != nil && !errors.Is(err, state.ErrNotInt64) {
			t.Fatalf("Int64(%q): %v, want ErrNotInt64", v, err)
		}
	})
}

// A count read back costs no allocation: Int64 runs for every record an
// aggregation counts.
func TestInt64DoesNotAllocate(t *testing.T) {
	v := []byte("1796578789086")
	if n := testing.AllocsPerRun(100, func() {
		if _, err := state.Int64(v); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("Int64 allocated %v times", n)
	}
}

// A sum through a handler's Scope copies no value: it parses the one the
// call, the transaction or the store holds, and hands its new one over.
// Its allocations are the new value and, for a key the call had not
// written, the call's copy of the key; the sums stay right wherever the
// old value was.
func TestASumInAScopeCopiesNoValue(t *testing.T) {
	key := []byte("region-0042")
	for _, tc := range []struct {
		name   string
		keep   bool // the call's writes move to the transaction after each sum
		allocs float64
	}{
		{"the call's own write", false, 1},
		{"the transaction's write", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := state.NewMemory()
			if err := m.Apply([]state.Write{{Key: key, Value: []byte("40")}}, state.Checkpoint{Offset: 1}); err != nil {
				t.Fatal(err)
			}
			tx := state.NewTxn(m, 0)
			sc := tx.Scope()
			// The first sum reads the store's value.
			if n, err := state.Sum(sc, key, 2); err != nil || n != 42 {
				t.Fatalf("first sum %d, %v; want 42", n, err)
			}
			if tc.keep {
				sc.Keep()
			}
			runs := 100
			if n := testing.AllocsPerRun(runs, func() {
				if _, err := state.Sum(sc, key, 1); err != nil {
					t.Fatal(err)
				}
				if tc.keep {
					sc.Keep()
				}
			}); n != tc.allocs {
				t.Fatalf("a sum allocated %v times, want %v", n, tc.allocs)
			}
			sc.Keep()
			v, ok, err := tx.Get(key)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			// AllocsPerRun runs the function once more than runs.
			if want := strconv.Itoa(42 + runs + 1); string(v) != want {
				t.Fatalf("the sum is %s, want %s", v, want)
			}
		})
	}
}

// A sum through a handler's Scope refuses what a sum on the transaction
// refuses, and writes nothing then: an overflow, a value that is no
// count, a sum too large for the changelog; a key the call deleted sums
// from nothing.
func TestASumInAScopeRefusesWhatTheTxnRefuses(t *testing.T) {
	m := state.NewMemory()
	if err := m.Apply([]state.Write{
		{Key: []byte("max"), Value: state.AppendInt64(nil, math.MaxInt64)},
		{Key: []byte("text"), Value: []byte("hello")},
		{Key: []byte("gone"), Value: []byte("7")},
	}, state.Checkpoint{Offset: 1}); err != nil {
		t.Fatal(err)
	}
	// 100 bytes of framing, the key's bytes and 3 for the sum.
	tx := state.NewTxn(m, 100+len("long-key")+3)
	sc := tx.Scope()
	if _, err := state.Count(sc, []byte("max")); !errors.Is(err, state.ErrOverflow) {
		t.Fatalf("overflow: %v", err)
	}
	if _, err := state.Count(sc, []byte("text")); !errors.Is(err, state.ErrNotInt64) {
		t.Fatalf("count of text: %v", err)
	}
	if n, err := state.Sum(sc, []byte("long-key"), 999); err != nil || n != 999 {
		t.Fatalf("a sum of 3 digits within the limit: %d, %v", n, err)
	}
	// As on the Txn: the sum it could not write, and ErrTooLarge.
	if n, err := state.Sum(sc, []byte("long-key"), 1); !errors.Is(err, state.ErrTooLarge) || n != 1000 {
		t.Fatalf("a sum of 4 digits past the limit: %d, %v; want 1000 and ErrTooLarge", n, err)
	}
	must(t, tx.Put([]byte("long-key"), []byte("999")))
	if n, err := state.Sum(tx, []byte("long-key"), 1); !errors.Is(err, state.ErrTooLarge) || n != 1000 {
		t.Fatalf("the same sum on the Txn: %d, %v", n, err)
	}
	must(t, sc.Delete([]byte("gone")))
	if n, err := state.Count(sc, []byte("gone")); err != nil || n != 1 {
		t.Fatalf("a count of a key the call deleted: %d, %v; want 1", n, err)
	}
	for key, want := range map[string]string{"max": "9223372036854775807", "text": "hello", "long-key": "999", "gone": "1"} {
		if v, _ := get(t, sc, key); v != want {
			t.Errorf("%s holds %q after the refusals, want %q", key, v, want)
		}
	}
}
