package topics

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/eoskit/eoskit"
	"github.com/eoskit/eoskit/internal/authz"
)

// Spec is the shape a topic must have.
type Spec struct {
	// Name is the topic's name.
	Name string
	// Partitions is the partition count. 0 (the default) takes the
	// broker's num.partitions when creating and accepts any count that
	// exists.
	Partitions int32
	// ReplicationFactor is the replicas per partition. 0 (the default)
	// takes the broker's default.replication.factor when creating and
	// accepts any factor that exists.
	ReplicationFactor int16
	// Configs are topic configs the topic must have, such as
	// "cleanup.policy": "compact". Nil (the default) sets and checks none.
	Configs map[string]string
}

// RequestTimeout bounds each request Ensure makes; WaitVisible bounds its
// wait for the topics it created (or saw created) to show in the metadata.
const (
	RequestTimeout = 30 * time.Second
	WaitVisible    = 30 * time.Second
)

// ErrConflict is what every *ConflictError matches with errors.Is.
var ErrConflict = errors.New("topic exists with another shape")

// ConflictError says that a topic exists with a shape other than its Spec
// asks for. Ensure changes nothing about it: alter it by hand, or change
// the Spec.
type ConflictError struct {
	Topic string
	// Setting is "partitions", "replication factor" or a config's name.
	Setting string
	// Want is the Spec's value, Have the topic's ("" for a config the
	// broker did not return).
	Want, Have string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("topic %q exists with %s %s, not %s; it is never changed: alter it or the spec", e.Topic, e.Setting, quoteEmpty(e.Have), e.Want)
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

func quoteEmpty(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}

// Ensure creates the topics of specs that are missing and checks the ones
// that exist (see the package doc). Every conflict found is returned,
// joined; it returns the names of the topics it created. The client's
// principal needs Describe and DescribeConfigs on each topic, and Create
// on those missing.
func Ensure(ctx context.Context, adm *kadm.Client, specs ...Spec) (created []string, err error) {
	names, err := validate(specs)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	details, err := list(ctx, adm, names)
	if err != nil {
		return nil, err
	}
	var existing []Spec
	var fresh []string // created here or by another process a moment ago
	for _, s := range specs {
		td := details[s.Name]
		if !errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
			if td.Err != nil {
				return created, fmt.Errorf("topics: look up %q: %w", s.Name, td.Err)
			}
			existing = append(existing, s)
			continue
		}
		made, err := create(ctx, adm, s)
		if err != nil {
			return created, err
		}
		if made {
			created = append(created, s.Name)
		} else {
			existing = append(existing, s) // another process created it first: check its shape
		}
		fresh = append(fresh, s.Name)
	}
	if _, err := waitVisible(ctx, adm, fresh, true); err != nil {
		return created, err
	}
	if len(existing) == 0 {
		return created, nil
	}
	return created, check(ctx, adm, existing)
}

func validate(specs []Spec) ([]string, error) {
	var names []string
	for _, s := range specs {
		switch {
		case s.Name == "":
			return nil, errors.New("topics: a spec has no name")
		case slices.Contains(names, s.Name):
			return nil, fmt.Errorf("topics: topic %q is named by two specs", s.Name)
		case s.Partitions < 0 || s.ReplicationFactor < 0:
			return nil, fmt.Errorf("topics: topic %q: partitions and replication factor are positive, or 0 for the broker's default", s.Name)
		}
		names = append(names, s.Name)
	}
	return names, nil
}

func list(ctx context.Context, adm *kadm.Client, names []string) (kadm.TopicDetails, error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	details, err := adm.ListTopics(ctx, names...)
	if ae, ok := errors.AsType[*kadm.AuthError](err); ok {
		return nil, &eoskit.AuthorizationError{Permission: fmt.Sprintf("Describe on topics %q", names), Err: ae.Err}
	}
	if err != nil {
		return nil, fmt.Errorf("topics: look up %q (within %s): %w", names, RequestTimeout, err)
	}
	for _, name := range names {
		if td := details[name]; authz.Refused(td.Err) {
			return nil, &eoskit.AuthorizationError{Permission: "Describe on topic " + name, Err: td.Err}
		}
	}
	return details, nil
}

// create creates s's topic; made is false when another process created it
// first.
func create(ctx context.Context, adm *kadm.Client, s Spec) (made bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	partitions, rf := s.Partitions, s.ReplicationFactor
	if partitions == 0 {
		partitions = -1
	}
	if rf == 0 {
		rf = -1
	}
	var configs map[string]*string
	if len(s.Configs) > 0 {
		configs = map[string]*string{}
		for k, v := range s.Configs {
			configs[k] = &v
		}
	}
	resp, err := adm.CreateTopic(ctx, partitions, rf, configs, s.Name)
	switch {
	case errors.Is(err, kerr.TopicAlreadyExists):
		return false, nil
	case authz.Refused(err):
		return false, &eoskit.AuthorizationError{Permission: "Create on topic " + s.Name, Err: err}
	case err != nil && resp.ErrMessage != "":
		return false, fmt.Errorf("topics: create %q: %w: %s", s.Name, err, resp.ErrMessage)
	case err != nil:
		return false, fmt.Errorf("topics: create %q: %w", s.Name, err)
	}
	return true, nil
}

// waitVisible waits until a fresh metadata request lists every topic of
// names whole (every partition; with leaders, each with a leader: a topic
// just created has none for a moment, one that exists may lack one while
// a broker is down, which does not change its shape), asking one broker at
// a time (the broker asked may know a topic before others do; the
// runners' own look-ups allow for that), and returns what it listed: a
// topic seen with an error or partitions missing would otherwise read as
// missing, or as a shape that conflicts.
func waitVisible(ctx context.Context, adm *kadm.Client, names []string, leaders bool) (kadm.TopicDetails, error) {
	if len(names) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, WaitVisible)
	defer cancel()
	for {
		// kadm's metadata comes from its client's cache for up to
		// MetadataMinAge (5 s by default), which holds the topic as
		// missing when it was looked up before its creation: asking for
		// the authorized operations sends each request to the broker.
		details, err := list(kadm.WithAuthorizedOps(ctx), adm, names)
		if ae, ok := errors.AsType[*eoskit.AuthorizationError](err); ok {
			return nil, ae
		}
		last := "no answer yet"
		if err == nil {
			last = notWhole(details, names, leaders)
			if last == "" {
				return details, nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("topics: the metadata did not show %q whole within %s (last: %s): %w", names, WaitVisible, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// notWhole says why details do not show a topic of names whole, or "".
func notWhole(details kadm.TopicDetails, names []string, leaders bool) string {
	for _, name := range names {
		td := details[name]
		switch {
		case td.Err != nil:
			return fmt.Sprintf("%q: %v", name, td.Err)
		case len(td.Partitions) == 0:
			return fmt.Sprintf("%q has no partitions yet", name)
		}
		for i := range int32(len(td.Partitions)) {
			p, ok := td.Partitions[i]
			switch {
			case !ok:
				return fmt.Sprintf("%q lacks partition %d", name, i)
			case leaders && (p.Leader < 0 || p.Err != nil):
				return fmt.Sprintf("%q partition %d has no leader yet", name, i)
			}
		}
	}
	return ""
}

// check compares the topics of specs, which exist, with their specs.
func check(ctx context.Context, adm *kadm.Client, specs []Spec) error {
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	details, err := waitVisible(ctx, adm, names, false)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	configs, err := adm.DescribeTopicConfigs(ctx, names...)
	if err != nil && !authz.Refused(err) {
		return fmt.Errorf("topics: describe the configs of %q (within %s): %w", names, RequestTimeout, err)
	}
	var errs []error
	for _, s := range specs {
		have := shapeOf(details[s.Name])
		var rc *kadm.ResourceConfig
		if c, cerr := configs.On(s.Name, nil); cerr == nil {
			rc = &c
		}
		if len(s.Configs) > 0 {
			switch {
			case rc == nil && err != nil:
				return &eoskit.AuthorizationError{Permission: "DescribeConfigs on topic " + s.Name, Err: err}
			case rc == nil:
				return fmt.Errorf("topics: the broker returned no configs for %q", s.Name)
			case authz.Refused(rc.Err):
				return &eoskit.AuthorizationError{Permission: "DescribeConfigs on topic " + s.Name, Err: rc.Err}
			case rc.Err != nil:
				return fmt.Errorf("topics: describe the configs of %q: %w", s.Name, rc.Err)
			}
			for _, k := range slices.Sorted(maps.Keys(s.Configs)) {
				have.configs[k] = configValue(rc, k)
			}
		}
		errs = append(errs, conflicts(s, have)...)
	}
	return errors.Join(errs...)
}

// shape is what a topic that exists has.
type shape struct {
	partitions int32
	rf         int16
	configs    map[string]string
}

// shapeOf is td's shape; its replication factor the smallest of its
// partitions' (the one that bounds its durability; a partition being
// reassigned lists its new replicas too).
func shapeOf(td kadm.TopicDetail) shape {
	sh := shape{partitions: int32(len(td.Partitions)), configs: map[string]string{}}
	for _, p := range td.Partitions {
		if rf := int16(len(p.Replicas)); sh.rf == 0 || rf < sh.rf {
			sh.rf = rf
		}
	}
	return sh
}

func configValue(rc *kadm.ResourceConfig, key string) string {
	for _, c := range rc.Configs {
		if c.Key == key && c.Value != nil {
			return *c.Value
		}
	}
	return ""
}

// conflicts compares a topic's shape with its spec: pure, one
// *ConflictError per setting that differs.
func conflicts(s Spec, have shape) []error {
	var errs []error
	if s.Partitions > 0 && have.partitions != s.Partitions {
		errs = append(errs, &ConflictError{Topic: s.Name, Setting: "partitions", Want: strconv.Itoa(int(s.Partitions)), Have: strconv.Itoa(int(have.partitions))})
	}
	if s.ReplicationFactor > 0 && have.rf != s.ReplicationFactor {
		errs = append(errs, &ConflictError{Topic: s.Name, Setting: "replication factor", Want: strconv.Itoa(int(s.ReplicationFactor)), Have: strconv.Itoa(int(have.rf))})
	}
	for _, k := range slices.Sorted(maps.Keys(s.Configs)) {
		if !sameConfig(k, s.Configs[k], have.configs[k]) {
			errs = append(errs, &ConflictError{Topic: s.Name, Setting: k, Want: s.Configs[k], Have: have.configs[k]})
		}
	}
	return errs
}

func sameConfig(key, want, have string) bool {
	if key != "cleanup.policy" {
		return want == have
	}
	set := func(v string) []string {
		var out []string
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return slices.Equal(set(want), set(have))
}
