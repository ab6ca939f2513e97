package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit/eos"
	"github.com/eoskit/eoskit/eos/eoshttp"
	"github.com/eoskit/eoskit/patterns/dashboard"
	"github.com/eoskit/eoskit/state"
	"github.com/eoskit/eoskit/window"
)

//go:embed page.html
var page []byte

// check is the totals processor's handler (kafkatokafka adds each
// report's cases to its region's total around it): it refuses a record
// that is no report with a usable time, which goes to the dead-letter
// topic, and writes nothing else.
func check(_ context.Context, in *kgo.Record) ([]*kgo.Record, error) {
	_, err := dashboard.ReportedAt(in)
	return nil, err
}

// routes serves the page, its JSON API and the probes.
func routes(totals, days *eos.Processor) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /api/partitions", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		n, err := totals.State().InputPartitions()
		if err != nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "web: the reports' partitions are not known yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(struct {
			Partitions int32 `json:"partitions"`
		}{n})
	})
	// Every page polls every partition: each is rendered once per
	// commit that changed it (Cache), however many pages are open.
	mux.Handle("GET /api/totals/{partition}", eoshttp.Partition(totals, totalsOf, eoshttp.Forward(nil), eoshttp.Cache()))
	mux.Handle("GET /api/days/{partition}", eoshttp.Partition(days, daysOf, eoshttp.Forward(nil), eoshttp.Cache()))
	mux.HandleFunc("GET /livez", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !totals.Health().Ready() || !days.Health().Ready() {
			http.Error(w, "not ready (restoring, or waiting for the group)", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	return mux
}

// totalsOf renders a partition of the totals: region to cases.
func totalsOf(view *eos.StateView, p int32) (any, error) {
	out := map[string]int64{}
	err := scan(view, p, func(k, v []byte) error {
		n, err := state.Int64(v)
		out[string(k)] = n
		return err
	})
	return out, err
}

// daysOf renders a partition of the counts per day: region to day
// (YYYY-MM-DD, UTC) to cases.
func daysOf(view *eos.StateView, p int32) (any, error) {
	out := map[string]map[string]int64{}
	err := scan(view, p, func(k, v []byte) error {
		region, start, err := window.SplitKey(k)
		if err != nil {
			return err
		}
		n, err := state.Int64(v)
		if out[string(region)] == nil {
			out[string(region)] = map[string]int64{}
		}
		out[string(region)][start.UTC().Format(time.DateOnly)] = n
		return err
	})
	return out, err
}

// scan calls fn on each key and value of partition p, stopping at its
// first error.
func scan(view *eos.StateView, p int32, fn func(k, v []byte) error) error {
	var bad error
	err := view.ScanPartition(p, nil, nil, func(k, v []byte) bool {
		if err := fn(k, v); err != nil {
			bad = fmt.Errorf("web: partition %d, key %q: %w", p, k, err)
		}
		return bad == nil
	})
	if err != nil {
		return err
	}
	return bad
}
