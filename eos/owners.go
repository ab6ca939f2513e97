package eos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/eoskit/eoskit"
)

// Endpoint advertises where this instance serves its state, as Kafka
// Streams' application.server: an absolute http or https URL, such as
// "http://10.0.0.5:8080", which the other instances of the group forward
// a key's read to when this one owns its partition ([StateView.Owner],
// package eos/eoshttp's Forward). The processor's Kafka client id
// carries it ("eoskit endpoint=" and the URL), so that the group's
// description shows every member's (DescribeGroups, or
// ConsumerGroupDescribe under [ConsumerProtocol]: Describe on the group,
// which Read on it grants). It cannot be given with a kgo.ClientID of
// one's own (a *[eoskit.ConfigError]), nor hold credentials, a query or
// a fragment. Default: none; the instance owns partitions no other can
// forward to, and forwards to none.
//
// Give a name that outlives the instance's address (a StatefulSet pod's
// DNS name through its headless service, not the pod's IP): under the
// classic protocol a static member ([InstanceID]) that restarts within
// its session timeout keeps its former client id, and so the endpoint it
// advertised before. Every member of the group is trusted: a read is
// forwarded to whatever URL the owner's client id names.
func Endpoint(rawURL string) ProcessorOption {
	return processorOpt(func(c *config) { c.endpoint, c.endpointSet = rawURL, true })
}

// endpointPrefix begins the client id of a processor given an Endpoint.
const endpointPrefix = "eoskit endpoint="

// validateEndpoint refuses an endpoint that is no absolute http(s) URL
// without spaces.
func validateEndpoint(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return err
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q is not an http or https URL", raw)
	case u.Host == "":
		return fmt.Errorf("%q names no host", raw)
	case u.User != nil:
		return fmt.Errorf("%q holds credentials, which the group's description would show anyone", raw)
	case u.RawQuery != "" || u.Fragment != "" || strings.Contains(raw, "?") || strings.Contains(raw, "#"):
		return fmt.Errorf("%q holds a query or a fragment: give the base URL the handlers are served under", raw)
	case strings.ContainsAny(raw, " \t\r\n"):
		return fmt.Errorf("%q holds spaces", raw)
	}
	return nil
}

// endpointOf returns the endpoint a member's client id advertises ("" for
// none, or for one that is no valid endpoint).
func endpointOf(clientID string) string {
	ep, ok := strings.CutPrefix(clientID, endpointPrefix)
	if !ok || validateEndpoint(ep) != nil {
		return ""
	}
	return ep
}

// ErrOwnerUnknown is what [StateView.Owner] returns when no member of
// the group holds the key's partition with an endpoint: the group
// rebalances, its owner advertises none ([Endpoint]), or the group could
// not be described.
var ErrOwnerUnknown = errors.New("eos: the partition's owner is not known")

// ownersRefresh is how old the group's description may be before an
// Owner reads it again; ownersRetry, when it shows nobody holding the
// partition asked (a rebalance under way).
const (
	ownersRefresh = time.Second
	ownersRetry   = 100 * time.Millisecond
)

// owners learns, from the group's description, which member holds each
// input partition and the endpoint it advertises.
type owners struct {
	conn             []kgo.Opt
	group, input     string
	consumerProtocol bool

	mu sync.Mutex
	// cl describes the group while Run runs (start); outside, each
	// description has a client of its own. A description started during
	// Run may end after it, its client closed: its error is not kept.
	cl   *kgo.Client
	at   time.Time
	view groupView
	err  error
	// refreshing is closed when the description under way ends (nil:
	// none runs): one at a time serves every caller, each waiting for it
	// no longer than its own ctx.
	refreshing chan struct{}
}

// groupView is what a description of the group shows.
type groupView struct {
	// byPart is each input partition's owner's endpoint ("" for an
	// owner without one).
	byPart map[int32]string
	// members are the endpoints the group's members advertise, sorted
	// (members without one left out).
	members []string
	// planned are the standbys the group's leader placed
	// (standbyBalancer), by the endpoint of the member to keep them:
	// only members whose assignment carries a plan.
	planned map[string][]int32
}

// endpoint returns the endpoint of partition p's owner, from a
// description at most ownersRefresh old (ownersRetry when the last failed
// or showed nobody holding p), waiting for one no longer than ctx.
func (o *owners) endpoint(ctx context.Context, p int32) (string, error) {
	v, err := o.current(ctx, func(age time.Duration, v groupView, err error) bool {
		_, listed := v.byPart[p]
		return age > ownersRefresh || (age > ownersRetry && (err != nil || !listed))
	})
	if err != nil {
		return "", fmt.Errorf("%w: describing the group %q: %w", ErrOwnerUnknown, o.group, err)
	}
	ep, ok := v.byPart[p]
	if !ok || ep == "" {
		return "", fmt.Errorf("%w: no member of %q holds partition %d with an endpoint", ErrOwnerUnknown, o.group, p)
	}
	return ep, nil
}

// current returns the group's description, described again first when
// stale says the last one is too old: by the description under way, or
// one it starts. The description serves every caller, and a caller's
// end neither cuts nor fails it; a caller waits for it no longer than
// its ctx, and gets ctx's error then. Its maps are never written again:
// read them, do not change them.
func (o *owners) current(ctx context.Context, stale func(age time.Duration, v groupView, err error) bool) (groupView, error) {
	o.mu.Lock()
	if !stale(time.Since(o.at), o.view, o.err) {
		defer o.mu.Unlock()
		return o.view, o.err
	}
	if err := ctx.Err(); err != nil {
		o.mu.Unlock()
		return groupView{}, err // a caller gone starts no description
	}
	done := o.refreshing
	if done == nil {
		done = make(chan struct{})
		o.refreshing = done
		go o.refresh(o.cl, done)
	}
	o.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return groupView{}, ctx.Err()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.view, o.err
}

// refresh describes the group through cl (nil: a client of its own), and
// closes done once the description is o's.
func (o *owners) refresh(cl *kgo.Client, done chan struct{}) {
	v, err := o.describe(cl)
	o.mu.Lock()
	if !errors.Is(err, kgo.ErrClientClosed) {
		o.view, o.err, o.at = v, err, time.Now()
	}
	// Else Run's client, closed as Run returned: what was known stays,
	// and the next caller that finds it old describes again.
	o.refreshing = nil
	o.mu.Unlock()
	close(done)
}

// snapshot returns what the group's description shows, from one at most
// ownersRefresh old, waiting for it no longer than ctx (read it, do not
// change it: see current).
func (o *owners) snapshot(ctx context.Context) (groupView, error) {
	return o.current(ctx, func(age time.Duration, _ groupView, _ error) bool { return age > ownersRefresh })
}

// describe reads the group's members' assignments, endpoints and
// planned standbys through cl (nil: a client of its own), within 5 s.
func (o *owners) describe(cl *kgo.Client) (groupView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cl == nil {
		var err error
		if cl, err = kgo.NewClient(o.conn...); err != nil {
			return groupView{}, err
		}
		defer cl.Close()
	}
	adm := kadm.NewClient(cl)
	v := groupView{byPart: map[int32]string{}, planned: map[string][]int32{}}
	member := func(clientID string, ps []int32) string {
		ep := endpointOf(clientID)
		if ep != "" && !slices.Contains(v.members, ep) {
			v.members = append(v.members, ep)
		}
		for _, p := range ps {
			v.byPart[p] = ep
		}
		return ep
	}
	if o.consumerProtocol {
		gs, err := adm.DescribeConsumerGroups(ctx, o.group)
		if err != nil {
			return groupView{}, err
		}
		g := gs[o.group]
		if g.Err != nil {
			return groupView{}, g.Err
		}
		for _, m := range g.Members {
			member(m.ClientID, slices.Collect(maps.Keys(m.Assignment[o.input])))
		}
	} else {
		gs, err := adm.DescribeGroups(ctx, o.group)
		if err != nil {
			return groupView{}, err
		}
		g := gs[o.group]
		if g.Err != nil {
			return groupView{}, g.Err
		}
		for _, m := range g.Members {
			var ps []int32
			a, ok := m.Assigned.AsConsumer()
			if ok {
				for _, t := range a.Topics {
					if t.Topic == o.input {
						ps = append(ps, t.Partitions...)
					}
				}
			}
			ep := member(m.ClientID, ps)
			// The leader's plan, when the group balances with
			// standbyBalancer (not when it agreed on another protocol).
			if ok && ep != "" && g.Protocol == standbyProtocol {
				if planned, ok := decodePlanned(a.UserData); ok {
					v.planned[ep] = planned
				}
			}
		}
	}
	slices.Sort(v.members)
	return v, nil
}

// Owner says where key's partition is served: Self when this instance
// holds it (ready or restoring: ask [StateView.Lookup]); else the
// endpoint ([Endpoint]) of the member the group's description, at most a
// second old (a tenth of one when the last failed or showed nobody
// holding it), shows holding it, or an error wrapping [ErrOwnerUnknown]. It waits for
// a description no longer than ctx (the error then wraps ctx's too);
// the description goes on for the callers after it.
// The description may be stale by a rebalance: the owner it names
// checks again, and answers only for a partition it holds (a forwarded
// read never returns another instance's value as current).
func (v *StateView) Owner(ctx context.Context, key []byte) (Owner, error) {
	p, err := v.PartitionOf(key)
	if err != nil {
		return Owner{}, err
	}
	return v.PartitionOwner(ctx, p)
}

// PartitionOwner is [StateView.Owner] of an input partition: where
// partition's state is served (a partition of a range or a scan, say).
func (v *StateView) PartitionOwner(ctx context.Context, p int32) (Owner, error) {
	if n, err := v.InputPartitions(); err != nil {
		return Owner{}, err
	} else if p < 0 || p >= n {
		return Owner{Partition: p}, fmt.Errorf("eos: the input has no partition %d (it has %d)", p, n)
	}
	v.ks.mu.RLock()
	_, held := v.ks.parts[p]
	_, taken := v.ks.marksLocked(p)
	v.ks.mu.RUnlock()
	if held && !taken {
		return Owner{Partition: p, Self: true}, nil
	}
	if v.ks.owners == nil {
		return Owner{Partition: p}, fmt.Errorf("%w: the processor was given no Endpoint, so it reads no other's", ErrOwnerUnknown)
	}
	ep, err := v.ks.owners.endpoint(ctx, p)
	return Owner{Partition: p, Endpoint: ep}, err
}

// Owner is where a key's partition is served (see [StateView.Owner]).
type Owner struct {
	Partition int32
	// Self: this instance holds the partition.
	Self bool
	// Endpoint is the owner's advertised URL when another instance
	// holds it.
	Endpoint string
}

// endpointOpts checks an Endpoint against the client options given and
// returns the client id option that advertises it.
func endpointOpts(c *config, userClientID string) ([]kgo.Opt, error) {
	if !c.endpointSet {
		return nil, nil
	}
	refuse := func(reason string) error {
		return &eoskit.ConfigError{Package: "eos", Setting: "Endpoint", Semantics: checkedAgainst(c.semantics), Reason: reason}
	}
	if err := validateEndpoint(c.endpoint); err != nil {
		return nil, refuse(err.Error())
	}
	if userClientID != "" && userClientID != "kgo" {
		return nil, refuse(fmt.Sprintf("the client id carries the endpoint; a kgo.ClientID (%q) cannot be given with it", userClientID))
	}
	return []kgo.Opt{kgo.ClientID(endpointPrefix + c.endpoint)}, nil
}

// start gives the descriptions a client until the returned stop is
// called (when Run returns): a description under way then ends with
// the client closed, and is not kept (refresh).
func (o *owners) start() (stop func(), err error) {
	cl, err := kgo.NewClient(o.conn...)
	if err != nil {
		return nil, fmt.Errorf("eos: the group's describing client: %w", err)
	}
	o.mu.Lock()
	o.cl = cl
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		o.cl = nil
		o.mu.Unlock()
		cl.Close()
	}, nil
}
