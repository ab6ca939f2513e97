// Package topics creates the topics an eoskit pipeline needs and refuses
// the ones that exist with a shape the pipeline cannot work with.
//
// The runners never create topics themselves: creating one needs Create on
// the topic (or the cluster), which an application's account does not
// usually have, and a topic created by a first produce gets the broker's
// defaults (one partition, delete retention), which is the wrong shape for
// an outbox's position topic. [Ensure] is for the deploy step or for an
// application whose account may create topics: it creates what is missing
// with the shape a [Spec] gives, and checks what exists against it.
//
// # What it guarantees
//
//   - A [Spec]'s topic that is missing is created with its partitions,
//     replication factor and configs, and Ensure returns only once the
//     cluster's metadata lists it with a leader for every partition, so
//     that a runner started right after finds it.
//   - A topic that exists is never changed: a partition count, replication
//     factor or config that differs from the Spec is a *[ConflictError]
//     naming the topic, the setting, the value wanted and the value found.
//     Ensure never adds partitions: that would move keys to other
//     partitions and break their order, and a changelog or an outbox
//     position topic co-partitioned with another would no longer be.
//   - Two processes ensuring the same topics at once both succeed (the one
//     that loses the creation race checks the winner's topic).
//   - Every request has a deadline; a refused request for want of an ACL
//     names the permission to grant (Create on the topic, or
//     DescribeConfigs on it).
//
// # What breaks it
//
//   - A config compared is the topic's effective value: a Spec asking for
//     the broker's default (cleanup.policy=delete, say) matches a topic
//     that does not set it. Values are compared as strings, except
//     cleanup.policy, whose values are compared as a set ("compact,delete"
//     equals "delete,compact").
//   - Someone changing the topic after Ensure returned: Ensure checks once.
//
// # The topics each path needs
//
//   - eos: its input topics and the topics its handler writes to, and the
//     dead-letter topic if DeadLetter names one. None is created by the
//     processor; a missing dead-letter topic is an *eoskit.ConfigError at Run.
//   - offsetstore and dedup: their input topics only (dead letters go to a
//     PostgreSQL table).
//   - outbox: the position topic of an exactly-once relay
//     ([outbox.PositionTopicSpec]: one partition, cleanup.policy=compact),
//     the topics its rows name, and the dead-letter topic if one is set.
package topics
