package loop

import (
	"context"
	"fmt"
	"reflect"

	"github.com/twmb/franz-go/pkg/kgo"
)

// PartitionsFunc is the shape of franz-go's partition callbacks.
type PartitionsFunc = func(context.Context, *kgo.Client, map[string][]int32)

// Hooks are a group's partition callbacks: a runner's own, or those a
// user passed through its ClientOptions. The runner's would replace the
// user's (franz-go keeps one of each), so [GroupHooks] calls the user's
// after the runner's instead.
type Hooks struct {
	Assigned, Revoked, Lost PartitionsFunc
}

// GroupHooks returns the group callbacks a runner installs: its own
// (ours), each followed by the user's (see ReadUserOptions). Every runner
// installs its callbacks through it, so that the user's are called alike
// everywhere and after the runner's.
func GroupHooks(ours, user Hooks) []kgo.Opt {
	if user.Lost == nil {
		// As franz-go does for a client without OnPartitionsLost: the
		// user's revoke callback hears of lost partitions too, though
		// the runner always sets a loss callback of its own.
		user.Lost = user.Revoked
	}
	return []kgo.Opt{
		kgo.OnPartitionsAssigned(Chain(ours.Assigned, user.Assigned)),
		kgo.OnPartitionsRevoked(Chain(ours.Revoked, user.Revoked)),
		kgo.OnPartitionsLost(Chain(ours.Lost, user.Lost)),
	}
}

// Chain returns the callback that runs ours, then the user's (if any).
func Chain(ours, users PartitionsFunc) PartitionsFunc {
	if users == nil {
		return ours
	}
	return func(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
		ours(ctx, cl, parts)
		users(ctx, cl, parts)
	}
}

// probe stands for "not given" in the client ReadUserOptions builds.
const probe = "eoskit-probe-not-given"

// ReadUserOptions looks at the franz-go options a user passed through a
// runner's ClientOptions (user, after the runner's base options, its
// semantics preset), in a client it builds and closes without using.
// It returns the user's partition callbacks, to chain, and an error naming
// the first option the runner owns (owned lists them by name:
// "ConsumerGroup", "ConsumeTopics", "ConsumeRegex", "ConsumePartitions",
// "TransactionalID", "AdjustFetchOffsetsFn", "BlockRebalanceOnPoll") with
// the runner's option to use instead (instead maps the former to the
// latter).
//
// The client has a group (franz-go takes partition callbacks only with
// one) and no topics, so it sends nothing: nothing to fetch metadata for,
// no group to join. franz-go wraps each callback in one that logs through
// the client it is called with and calls the user's, or, for a revoke the
// user left unset, its own offset commit, which the presets' disabled
// auto-commit turns into nothing; that wrapper is what is chained. Like
// the client each constructor builds to check the options, and each
// session's, this one is created and closed: hooks of kgo.WithHooks see it
// (HookNewClient, HookClientClosed).
func ReadUserOptions(base, opts []kgo.Opt, instead map[string]string) (Hooks, error) {
	all := append(append(append([]kgo.Opt{}, base...), kgo.ConsumerGroup(probe), kgo.DisableAutoCommit()), opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return Hooks{}, err
	}
	defer cl.Close()
	set := map[string]bool{
		"ConsumerGroup":        cl.OptValue(kgo.ConsumerGroup) != probe,
		"ConsumeTopics":        !isEmpty(cl.OptValue(kgo.ConsumeTopics)),
		"ConsumeRegex":         cl.OptValue(kgo.ConsumeRegex) == true,
		"ConsumePartitions":    !isEmpty(cl.OptValue(kgo.ConsumePartitions)),
		"TransactionalID":      cl.OptValue(kgo.TransactionalID) != "",
		"AdjustFetchOffsetsFn": !isNil(cl.OptValue(kgo.AdjustFetchOffsetsFn)),
		"BlockRebalanceOnPoll": cl.OptValue(kgo.BlockRebalanceOnPoll) == true,
	}
	for _, name := range []string{"ConsumerGroup", "ConsumeTopics", "ConsumeRegex", "ConsumePartitions", "TransactionalID", "AdjustFetchOffsetsFn", "BlockRebalanceOnPoll"} {
		if use, owned := instead[name]; owned && set[name] {
			return Hooks{}, fmt.Errorf("kgo.%s is the runner's to set: %s", name, use)
		}
	}
	hooks := Hooks{}
	hooks.Assigned, _ = cl.OptValue(kgo.OnPartitionsAssigned).(PartitionsFunc)
	hooks.Revoked, _ = cl.OptValue(kgo.OnPartitionsRevoked).(PartitionsFunc)
	hooks.Lost, _ = cl.OptValue(kgo.OnPartitionsLost).(PartitionsFunc)
	return hooks, nil
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	switch r.Kind() {
	case reflect.Func, reflect.Map, reflect.Pointer, reflect.Slice, reflect.Interface:
		return r.IsNil()
	}
	return false
}

func isEmpty(v any) bool {
	if isNil(v) {
		return true
	}
	r := reflect.ValueOf(v)
	return (r.Kind() == reflect.Map || r.Kind() == reflect.Slice) && r.Len() == 0
}
