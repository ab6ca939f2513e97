package txnscan

import "testing"

// The broker places a group's offsets by Java's String.hashCode; a wrong
// hash would make the hanging-transaction check look in the wrong
// partition. The expected values are what Java computes.
func TestJavaStringHashMatchesJava(t *testing.T) {
	for _, c := range []struct {
		s    string
		want int32
	}{
		{"", 0},
		{"test", 3556498},
		{"hello", 99162322},
		{"é", 233},
		{"😀", 1772899}, // a surrogate pair: two UTF-16 units
		{"a-much-longer-consumer-group-name", 1408396288},
		{"polygenelubricants", -2147483648}, // overflows to the minimum int32
	} {
		if got := javaStringHash(c.s); got != c.want {
			t.Errorf("javaStringHash(%q) = %d, want %d", c.s, got, c.want)
		}
	}
	// Kafka takes hash & 0x7fffffff, not Math.abs (which stays negative
	// for the minimum int32).
	for group, want := range map[string]int32{"a-much-longer-consumer-group-name": 38, "polygenelubricants": 0} {
		if got := GroupPartition(group, 50); got != want {
			t.Errorf("GroupPartition(%q, 50) = %d, want %d", group, got, want)
		}
	}
}
