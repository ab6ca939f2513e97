package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// printTable writes every row as one markdown table. Each figure is
// followed by its ratio to the at-least-once baseline of the same path and
// record size (the first row of that path and size), and a variant with a
// clean counterpart (1% malformed records) by its ratio to that one too,
// against the goal of issue 26 (at least 0.5x).
func printTable(w io.Writer, rows []row, runs int) {
	fmt.Fprintf(w, "\n| path | variant | record | records per run | records/s (median of %d) | p50 latency | p99 latency | peak heap MiB |\n", runs)
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	var base row
	for _, r := range rows {
		if base.path != r.path || base.size != r.size {
			base = r
		}
		rate, baseRate := median(r.rates), median(base.rates)
		vsClean := ""
		for _, c := range rows {
			if r.clean != "" && c.path == r.path && c.size == r.size && c.variant == r.clean {
				ratio := rate / median(c.rates)
				vsClean = fmt.Sprintf("; %.2fx clean, goal ≥ %.2fx: %s", ratio, goalVsClean, metOrMissed(ratio >= goalVsClean))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %d B | %d | %.0f (%.2fx%s) | %s | %s | %s |\n", r.path, r.variant, r.size, r.records,
			rate, rate/baseRate, vsClean, latency(r.p50, base.p50), latency(r.p99, base.p99), heap(r.heap, base.heap))
	}
}

// goalVsClean is issue 26's goal for a database path with 1% malformed
// records under DeadLetter, against the same path on clean input.
const goalVsClean = 0.5

// latency writes d, with its ratio to base unless base is 0.
func latency(d, base time.Duration) string {
	if d == 0 {
		return "-"
	}
	if base == 0 {
		return d.Round(100 * time.Microsecond).String()
	}
	return fmt.Sprintf("%s (%.2fx)", d.Round(100*time.Microsecond), float64(d)/float64(base))
}

func heap(b, base uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f (%.2fx)", float64(b)/(1<<20), float64(b)/float64(base))
}

// rateCells is a windowed row's records/s (the median), min-max and
// spread cells.
func rateCells(rs []float64) string {
	return fmt.Sprintf("%.0f | %.0f-%.0f | %.0f%%", median(rs), slices.Min(rs), slices.Max(rs), spread(rs))
}

// spread is (max-min)/median, in percent.
func spread(xs []float64) float64 {
	m := median(xs)
	if m == 0 {
		return 0
	}
	return 100 * (slices.Max(xs) - slices.Min(xs)) / m
}

// baseOf returns the median rate of the row of size with role.
func baseOf(rows []wrow, size int, role string) float64 {
	for _, r := range rows {
		if r.size == size && r.v.role == role {
			return median(r.rates())
		}
	}
	return 0
}

// ratiosTo returns r's median rate as a ratio to each of the rows of its
// size with roles.
func ratiosTo(rows []wrow, r wrow, roles ...string) []float64 {
	med := median(r.rates())
	vs := make([]float64, len(roles))
	for i, role := range roles {
		vs[i] = med / baseOf(rows, r.size, role)
	}
	return vs
}

// The CPU-bound goals of issue 13, for eos.Processor at 100 ms.
const (
	goalVsAtLeastOnce = 0.97
	goalVsRaw         = 0.97
	goalVsProducer    = 0.5 // the single-partition copy
)

// printEOS writes the CPU-bound table.
func printEOS(w io.Writer, rows []wrow, b *bench) {
	fmt.Fprintf(w, "\neos, CPU-bound copy handler, 6 partitions: input records committed per second (the group's committed offsets) during a %s window after a %s warm-up, from a backlog; median of %d interleaved runs (min-max; spread = (max-min)/median). Goals for eos.Processor at 100ms: ≥ %.2fx the at-least-once loop, ≥ %.2fx the raw session\n\n",
		b.window, b.warmup, b.runs, goalVsAtLeastOnce, goalVsRaw)
	fmt.Fprintln(w, "| record | variant | records/s | min-max | spread | vs at-least-once | vs raw session | CPU µs per record | p50 latency | p99 latency | goals |")
	fmt.Fprintln(w, "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, r := range rows {
		rs := r.rates()
		vs := ratiosTo(rows, r, roleAtLeastOnce, roleRaw)
		alo, raw := vs[0], vs[1]
		goals := ""
		if r.v.role == roleGoal {
			goals = fmt.Sprintf("≥ %.2fx at-least-once: %s; ≥ %.2fx raw: %s", goalVsAtLeastOnce, metOrMissed(alo >= goalVsAtLeastOnce), goalVsRaw, metOrMissed(raw >= goalVsRaw))
		}
		fmt.Fprintf(w, "| %d B | %s | %s | %.2fx | %.2fx | %s | %s | %s | %s |\n", r.size, r.v.name, rateCells(rs),
			alo, raw, cpuCell(r), latency(r.p50, 0), latency(r.p99, 0), goals)
	}
}

// printSingle writes the single-partition table, and what the processors'
// clients asked of the broker meanwhile.
func printSingle(w io.Writer, rows []wrow, b *bench) {
	fmt.Fprintf(w, "\nOne partition, %d B records: input records committed per second during a %s window after a %s warm-up, from a backlog (the producer: records acknowledged); median of %d interleaved runs. Goal: eos.Processor with its defaults ≥ %.2fx the idempotent producer alone\n\n",
		rows[0].size, b.window, b.warmup, b.runs, goalVsProducer)
	fmt.Fprintln(w, "| variant | records/s | min-max | spread | vs producer | CPU µs per record | records per commit | commits/s | ms open per commit | goal |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
	for _, r := range rows {
		rs := r.rates()
		med := median(rs)
		ratio := med / baseOf(rows, r.size, roleProducer)
		perCommit, perSecond, open := "-", "-", "-"
		var txns int64
		var window, opened time.Duration
		var records float64
		for _, res := range r.results {
			txns += res.txns
			window += res.window
			opened += res.txnOpen
			records += res.rate * res.window.Seconds()
		}
		if txns > 0 {
			perCommit = fmt.Sprintf("%.0f", records/float64(txns))
			perSecond = fmt.Sprintf("%.1f", float64(txns)/window.Seconds())
			open = fmt.Sprintf("%.1f", float64(opened.Microseconds())/1000/float64(txns))
		}
		goal := ""
		if r.v.role == roleGoal {
			goal = fmt.Sprintf("≥ %.2fx producer: %s", goalVsProducer, metOrMissed(ratio >= goalVsProducer))
		} else if strings.HasPrefix(r.v.name, "eos.Processor") {
			goal = fmt.Sprintf("(as a default: %s)", metOrMissed(ratio >= goalVsProducer))
		}
		fmt.Fprintf(w, "| %s | %s | %.2fx | %s | %s | %s | %s | %s |\n", r.v.name, rateCells(rs), ratio, cpuCell(r), perCommit, perSecond, open, goal)
	}

	keys := []int16{1, 0, 28, 26, 8} // Fetch, Produce, TxnOffsetCommit, EndTxn, OffsetCommit
	fmt.Fprintf(w, "\nRequests of the processors' clients during the windows: per second, mean milliseconds from write to response, and how many per second took %s or more\n", slowRequest)
	fmt.Fprintln(w)
	fmt.Fprint(w, "| variant |")
	for _, k := range keys {
		fmt.Fprintf(w, " %s |", kmsg.NameForKey(k))
	}
	fmt.Fprint(w, "\n| --- |")
	for range keys {
		fmt.Fprint(w, " ---: |")
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		var window time.Duration
		sums := map[int16]reqStat{}
		for _, res := range r.results {
			window += res.window
			for k, s := range res.requests {
				t := sums[k]
				t.n += s.n
				t.d += s.d
				t.slow += s.slow
				sums[k] = t
			}
		}
		if len(sums) == 0 {
			continue
		}
		fmt.Fprintf(w, "| %s |", r.v.name)
		for _, k := range keys {
			s := sums[k]
			if s.n == 0 {
				fmt.Fprint(w, " - |")
				continue
			}
			fmt.Fprintf(w, " %.1f/s, %.1f ms, %.1f/s slow |", float64(s.n)/window.Seconds(), float64(s.d.Microseconds())/1000/float64(s.n), float64(s.slow)/window.Seconds())
		}
		fmt.Fprintln(w)
	}
}

// cpuCell is the benchmark process's CPU time per record: steadier than
// the rate on a shared machine, and the broker's share is not in it.
func cpuCell(r wrow) string {
	if c := r.cpuPerRecord(); c > 0 {
		return fmt.Sprintf("%.2f", c)
	}
	return "-"
}
