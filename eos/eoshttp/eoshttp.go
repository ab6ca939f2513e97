// Package eoshttp serves a stateful eos.Processor's committed state over
// HTTP, key by key, from the instance that holds the key's partition, and
// says so when it does not: an endpoint never answers for a partition it
// does not hold, or is restoring, as if the key had no value.
//
//	mux := http.NewServeMux()
//	mux.Handle("GET /state/{key...}", eoshttp.Handler(p))
//
// GET (or HEAD) /state/{key} answers, for the key as the path gives it
// (decoded: escape a "/" in a key as %2F, and a key "." or ".." as %2E):
//
//   - 200 with its committed value (application/octet-stream) when this
//     instance holds its partition, restored;
//   - 404 when it holds the partition and the key has no value there;
//   - 503 with Retry-After: 1 while the partition restores here, while
//     the processor does not run or waits for its assignment, or before
//     it learnt its input's partitions;
//   - 421 (Misdirected Request) when this instance runs, has its
//     assignment and does not hold the partition (another instance does,
//     or it was just revoked from this one): the body names the
//     partition, as JSON {"partition": 3}, so that a caller or a proxy
//     asks its owner.
//
// Every answer carries the key's partition in the header Eoskit-Partition
// when it is known, and Cache-Control: no-store. The key is looked up as
// the processor's store holds it: a windowed or session aggregation keeps
// its windows under window.AppendKey or AppendSessionKey, so read those
// with StateView.Windows and Sessions (a GET of the plain key answers
// 404). Serve it where the probes are, or behind the application's own
// authentication: it answers every key's value.
//
// With [Forward], an instance asked for a key of a partition another
// holds forwards the request to that instance's endpoint (eos.Endpoint:
// the base URL the owner serves this same path under), found in the
// group's description (eos.StateView.Owner), and relays its answer with
// the header Eoskit-Forwarded naming the owner; the request carries none
// of the caller's headers but those named with [ForwardHeaders] (its
// credentials, for an authentication in front of the owner's handler:
// read that option's warning). The owner checks again:
// a description a rebalance made stale yields a 421 or a 503, never
// another instance's value as current. A forwarded request carries
// Eoskit-Forwarded itself and is never forwarded again. Without a known
// owner (a rebalance, an owner without an endpoint), the answer is the
// 421 above.
//
// What it cannot see: an instance that lost its partitions without
// knowing it yet (stopped or cut off from the brokers past its session
// timeout, while the group gave them to another) answers from its last
// committed state until its client learns of the loss, at its next
// heartbeat (a few seconds): a value current when it stopped, short of
// what the new owner committed since.
//
// [Partition] serves a whole input partition, rendered as JSON by a
// function of the caller's (a partition's totals, say), with the same
// answers: a page or a client adds up every partition's 200, and shows
// nothing while one is missing (patterns/dashboard/web does). Ranges and
// prefixes across partitions are read with eos.StateView.Scan and Prefix
// on each owner.
//
// With [Stale], a key this instance cannot get the owner's answer for
// (nobody is known to hold its partition, the owner did not answer or
// answered 503, or there is no Forward) is answered from the standby
// replica this instance keeps of its partition (eos.Standbys), when it
// keeps one caught up: 200 or 404 as above, with the header Eoskit-Stale
// giving when the standby's last catch-up began (RFC 3339), never
// without it. A stale answer is the owner's committed value of that
// moment, not now's: it may be older than one answered before, and
// older than that time says while a transaction its owner left open
// holds back what committed after it (until the broker aborts it). Only
// this instance's standby answers: a forwarded request is never answered
// stale (its owner, asked again by the group's description, answers
// current or 421 or 503, and the instance that forwarded it falls back
// on its own standby), and only Handler's keys ([Partition] never
// answers stale). A partition restoring here has no standby any more
// (the restore took it over): 503. A handler without Stale relays no
// stale answer.
package eoshttp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/eos"
)

// PartitionHeader names the key's input partition in every answer that
// knows it.
const PartitionHeader = "Eoskit-Partition"

// ForwardedHeader marks a request forwarded to its key's owner (it is
// never forwarded again), and names the owner on the answer relayed.
const ForwardedHeader = "Eoskit-Forwarded"

// StaleHeader marks an answer read from a standby replica (see [Stale]):
// when it last caught up with its owner's committed changelog, in RFC
// 3339 (UTC). An answer without it is the owner's, current.
const StaleHeader = "Eoskit-Stale"

// Option configures a Handler.
type Option func(*options)

type options struct {
	forward bool
	client  *http.Client
	headers []string
	stale   bool
	cache   *partitionCache // Partition's, with Cache
}

// Stale lets Handler answer a key from this instance's standby replica
// of its partition when the owner's answer cannot be had, marked with
// [StaleHeader] (see the package's doc). Default: never; a 421 or a 503
// instead.
func Stale() Option {
	return func(o *options) { o.stale = true }
}

// ForwardHeaders names the request headers a forwarded request carries to
// the owner (with Forward): "Authorization", say, for an authentication
// in front of the owner's handler. Default: none. An owner's endpoint is
// what the member advertises of itself (eos.Endpoint, in its client id):
// anyone who may join the group can advertise one of theirs, so forward
// credentials only where only trusted instances join the group (its ACLs,
// see docs/least-privilege.md), and over https. Connection headers
// (RFC 9110, 7.6.1) are never forwarded, whatever is named.
func ForwardHeaders(names ...string) Option {
	return func(o *options) {
		for _, n := range names {
			if !slices.ContainsFunc(hopByHop, func(h string) bool { return strings.EqualFold(h, n) }) {
				o.headers = append(o.headers, http.CanonicalHeaderKey(n))
			}
		}
	}
}

// Forward makes the handler forward a key's read to the instance that
// holds its partition (see the package's doc), with client (nil: a
// client whose requests time out after 5 s).
func Forward(client *http.Client) Option {
	return func(o *options) {
		o.forward = true
		o.client = client
		if o.client == nil {
			o.client = &http.Client{Timeout: 5 * time.Second,
				// The owner answers itself: a redirect is relayed, not
				// followed.
				CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		}
	}
}

// Source is what Handler serves: an *eos.Processor, or an *eos.Grouped
// (its aggregating processor's state, the worse of its two Healths).
type Source interface {
	State() *eos.StateView
	Health() eoskit.Health
}

// Handler answers GET and HEAD requests for src's keys, the key being the
// request's path value "key" (route it as "GET /state/{key...}"). It
// panics if src keeps no state (a processor without eos.Changelog), as
// http.Handle does for a bad pattern: a programming error, found when
// the program starts.
func Handler(src Source, opts ...Option) http.Handler {
	return handler(src, opts, func(w http.ResponseWriter, r *http.Request, o *options) {
		key := r.PathValue("key")
		if key == "" {
			http.Error(w, "eoshttp: no key (route the handler as GET /state/{key...})", http.StatusBadRequest)
			return
		}
		view := src.State()
		part, err := view.PartitionOf([]byte(key))
		switch {
		case errors.Is(err, eos.ErrNotHeld):
			unavailable(w, "eoshttp: the processor has not read its input's partitions yet")
			return
		case err != nil:
			http.Error(w, "eoshttp: the key's partition cannot be found (see the processor's configuration)", http.StatusInternalServerError)
			return
		}
		w.Header().Set(PartitionHeader, strconv.Itoa(int(part)))
		value, ok, err := view.Lookup([]byte(key))
		var notHeld *eos.NotHeldError
		switch {
		case errors.As(err, &notHeld):
			o.notHeld(w, r, src, notHeld, []byte(key))
		case err != nil:
			http.Error(w, "eoshttp: the state could not be read", http.StatusInternalServerError)
		default:
			writeValue(w, value, ok)
		}
	})
}

// handler is what Handler and Partition share: src checked, opts applied,
// Cache-Control: no-store on every answer, and methods but GET and HEAD
// refused before serve is called.
func handler(src Source, opts []Option, serve func(http.ResponseWriter, *http.Request, *options)) http.Handler {
	if src.State() == nil {
		panic("eoshttp: the processor keeps no state (give it eos.Changelog)")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "eoshttp: GET or HEAD", http.StatusMethodNotAllowed)
			return
		}
		serve(w, r, &o)
	})
}

// notHeld answers a request for a partition this instance cannot answer
// for (nh): 503 while it restores here, or while the processor does not
// run or waits for its assignment (then it cannot tell whose it is);
// else, another instance's: relayed to its owner with Forward, or 421.
// With Stale, a key's (key not nil) standby answers instead of a 421 or
// a 503, the owner's or this instance's, when it can.
func (o *options) notHeld(w http.ResponseWriter, r *http.Request, src Source, nh *eos.NotHeldError, key []byte) {
	// A forwarded request is never answered stale: it was sent here as
	// to the owner, whose answer is current or none; the instance that
	// forwarded it falls back on its own standby.
	forwarded := r.Header.Get(ForwardedHeader) != ""
	stale := o.stale && key != nil && !forwarded
	answer := func(refuse func()) {
		if !stale || !serveStale(w, r, src.State(), key) {
			refuse()
		}
	}
	if nh.Restoring {
		answer(func() { unavailable(w, "eoshttp: the partition is restoring here") })
		return
	}
	if h := src.Health(); !h.Running || !h.Joined {
		answer(func() { unavailable(w, "eoshttp: the processor does not run, or waits for its assignment") })
		return
	}
	if o.forward && !forwarded {
		// The group's description may be slow to come (brokers out of
		// reach): a request waits for it a second at most.
		lookup, cancel := context.WithTimeout(r.Context(), ownerWait)
		owner, err := src.State().PartitionOwner(lookup, nh.Partition)
		cancel()
		if err == nil && !owner.Self && owner.Endpoint != "" {
			if !o.relay(w, r, owner.Endpoint, stale) {
				answer(func() {
					w.Header().Set(ForwardedHeader, owner.Endpoint)
					unavailable(w, "eoshttp: the key's owner did not answer, was not ready, or did not hold it")
				})
			}
			return
		}
	}
	answer(func() {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMisdirectedRequest)
		_ = json.NewEncoder(w).Encode(struct {
			Partition int32 `json:"partition"`
		}{nh.Partition})
	})
}

// ownerWait bounds a forwarding request's wait for the group's
// description, which names the key's owner.
const ownerWait = time.Second

// staleWait bounds a stale read's wait for a standby's catch-up under way
// (one can hang while the brokers do not answer).
const staleWait = time.Second

// serveStale answers key from this instance's standby of its partition,
// marked with StaleHeader, and reports whether it could.
func serveStale(w http.ResponseWriter, r *http.Request, view *eos.StateView, key []byte) bool {
	ctx, cancel := context.WithTimeout(r.Context(), staleWait)
	defer cancel()
	value, ok, asOf, err := view.StandbyLookup(ctx, key)
	if err != nil {
		return false
	}
	w.Header().Set(StaleHeader, asOf.UTC().Format(time.RFC3339Nano))
	writeValue(w, value, ok)
	return true
}

// writeValue answers a key's value: 200 with it when found, else 404.
func writeValue(w http.ResponseWriter, value []byte, found bool) {
	if !found {
		http.Error(w, "eoshttp: no value", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(value)
}

// relay forwards r to the owner at endpoint and writes its answer, and
// reports whether it wrote one: not when the owner did not answer, nor,
// when orStale (a stale answer may be given instead), when it answered
// 503 or 421 (it does not hold the partition now).
func (o *options) relay(w http.ResponseWriter, r *http.Request, endpoint string, orStale bool) bool {
	target := strings.TrimSuffix(endpoint, "/") + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, target, nil)
	if err != nil {
		http.Error(w, "eoshttp: the owner's endpoint is no URL", http.StatusBadGateway)
		return true
	}
	for _, name := range o.headers {
		for _, v := range r.Header.Values(name) {
			req.Header.Add(name, v)
		}
	}
	req.Header.Set(ForwardedHeader, "1")
	resp, err := o.client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	switch {
	case orStale && (resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusMisdirectedRequest):
		return false
	case resp.Header.Get(StaleHeader) != "":
		// A forwarded request answered stale (by an eoskit before this
		// rule, or another server): never relayed.
		if orStale {
			return false // this instance's own standby may answer
		}
		w.Header().Set(ForwardedHeader, endpoint)
		unavailable(w, "eoshttp: the key's owner answered only from a standby")
		return true
	}
	for _, h := range []string{"Content-Type", "Retry-After", "Www-Authenticate", PartitionHeader} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.Header().Set(ForwardedHeader, endpoint)
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
	return true
}

// hopByHop are the headers of one connection (RFC 9110, 7.6.1), never
// forwarded.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func unavailable(w http.ResponseWriter, msg string) {
	w.Header().Set("Retry-After", "1")
	http.Error(w, msg, http.StatusServiceUnavailable)
}

var (
	_ Source = (*eos.Processor)(nil)
	_ Source = (*eos.Grouped)(nil)
)
