package main

import (
	"fmt"
	"io"
	"time"
)

// printTable writes every row as one markdown table. Each figure is
// followed by its ratio to the at-least-once baseline of the same path and
// record size (the first row of that path and size).
func printTable(w io.Writer, rows []row, runs int) {
	fmt.Fprintf(w, "\n| path | variant | record | records per run | records/s (median of %d) | p50 latency | p99 latency | peak heap MiB |\n", runs)
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	var base row
	for _, r := range rows {
		if base.path != r.path || base.size != r.size {
			base = r
		}
		rate, baseRate := median(r.rates), median(base.rates)
		fmt.Fprintf(w, "| %s | %s | %d B | %d | %.0f (%.2fx) | %s | %s | %s |\n", r.path, r.variant, r.size, r.records,
			rate, rate/baseRate, latency(r.p50, base.p50), latency(r.p99, base.p99), heap(r.heap, base.heap))
	}
}

func latency(d, base time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%s (%.2fx)", d.Round(100*time.Microsecond), float64(d)/float64(base))
}

func heap(b, base uint64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f (%.2fx)", float64(b)/(1<<20), float64(b)/float64(base))
}
