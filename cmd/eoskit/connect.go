package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// kafkaFlags are the flags every command takes to reach the cluster:
// its own, or, as Kafka's tools take them, a -command-config properties
// file; a flag given wins over the file.
type kafkaFlags struct {
	fs                                    *flag.FlagSet
	brokers, mechanism, user, tokenFile   *string
	caFile, certFile, keyFile, properties *string
	timeout                               *time.Duration
	json, tls                             *bool
}

func addKafkaFlags(fs *flag.FlagSet) kafkaFlags {
	return kafkaFlags{
		fs:         fs,
		brokers:    fs.String("brokers", "", "Kafka bootstrap addresses, comma-separated (default: -command-config's bootstrap.servers, else $KAFKA_BROKERS, else 127.0.0.1:9092)"),
		timeout:    fs.Duration("timeout", time.Minute, "give up after this long"),
		json:       fs.Bool("json", false, "print JSON"),
		mechanism:  fs.String("sasl-mechanism", "", "SASL mechanism: scram-sha-256, scram-sha-512 or plain (password in $EOSKIT_SASL_PASSWORD), or oauthbearer (token in -sasl-token-file); plain and oauthbearer only over TLS"),
		user:       fs.String("sasl-user", "", "SASL user name"),
		tokenFile:  fs.String("sasl-token-file", "", "for oauthbearer: a file holding the token (a JWT), read at each authentication, so that a token renewed in place is taken"),
		tls:        fs.Bool("tls", false, "connect with TLS (trusting the system's root certificates, or -tls-ca's)"),
		caFile:     fs.String("tls-ca", "", "connect with TLS, trusting the CA certificates (PEM) in this file alone"),
		certFile:   fs.String("tls-cert", "", "the client certificate (PEM) for mutual TLS, with -tls-key"),
		keyFile:    fs.String("tls-key", "", "the client certificate's private key (PEM)"),
		properties: fs.String("command-config", "", "a Kafka client properties file, as Kafka's tools take: bootstrap.servers, security.protocol, sasl.mechanism, sasl.jaas.config (or sasl.username and sasl.password), sasl.oauthbearer.token.endpoint.url (a file: URL), ssl.truststore.location or ssl.ca.location (PEM), ssl.keystore.location (PEM) or ssl.certificate.location and ssl.key.location"),
	}
}

// connection is how a command reaches the cluster, from its flags and
// -command-config.
type connection struct {
	seeds []string
	opts  []kgo.Opt // the seeds included
}

// settings are the connection settings, from -command-config and then the
// flags given.
type settings struct {
	brokers, protocol, mechanism, user, pass string
	caFile, certFile, keyFile, tokenFile     string
	// extensions are OAUTHBEARER's SASL extensions (the JAAS options
	// extension_NAME, as Confluent Cloud's logicalCluster).
	extensions map[string]string
	// refused holds what -command-config asks for that eoskit cannot
	// honour, by the flag that would override it.
	refused map[string]error
}

// connect returns the connection the flags and -command-config ask for.
func (f kafkaFlags) connect() (connection, error) {
	s, useTLS, err := f.settings()
	if err != nil {
		return connection{}, err
	}
	return s.connection(useTLS)
}

// settings merges -command-config's settings and the flags given (a flag
// wins), and says whether to use TLS.
func (f kafkaFlags) settings() (s settings, useTLS bool, err error) {
	if *f.properties != "" {
		props, err := readProperties(*f.properties)
		if err != nil {
			return s, false, err
		}
		if s, err = fromProperties(props); err != nil {
			return s, false, fmt.Errorf("-command-config %s: %w", *f.properties, err)
		}
	}
	given := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	// A mechanism given instead of the file's lifts what the file's
	// mechanism needed (its token's file).
	otherMechanism := given["sasl-mechanism"] && !strings.EqualFold(*f.mechanism, "oauthbearer")
	for name, err := range s.refused {
		if !given[name] && !(name == "sasl-token-file" && otherMechanism) {
			return s, false, fmt.Errorf("-command-config %s: %w", *f.properties, err)
		}
	}
	if given["brokers"] || s.brokers == "" {
		s.brokers = *f.brokers
	}
	if s.brokers == "" {
		s.brokers = os.Getenv("KAFKA_BROKERS")
	}
	if s.brokers == "" {
		s.brokers = "127.0.0.1:9092"
	}
	switch {
	case given["sasl-mechanism"]:
		s.mechanism = *f.mechanism
		if otherMechanism {
			s.tokenFile = "" // the file's, for the mechanism not used
		}
	case given["sasl-token-file"]:
		s.mechanism = "oauthbearer"
	}
	// The password in $EOSKIT_SASL_PASSWORD goes with -sasl-user, or
	// stands in for a file that gives none; a file's own user and
	// password are never mixed with it.
	if pass := os.Getenv("EOSKIT_SASL_PASSWORD"); given["sasl-user"] || s.pass == "" && pass != "" {
		s.pass = pass
	}
	if given["sasl-user"] {
		s.user = *f.user
	}
	if given["sasl-token-file"] {
		s.tokenFile = *f.tokenFile
	}
	if strings.EqualFold(s.mechanism, "oauthbearer") {
		if given["sasl-user"] {
			return s, false, errors.New("-sasl-user: OAUTHBEARER authenticates with the token alone (the principal is its subject)")
		}
		s.user, s.pass = "", ""
	} else if given["sasl-token-file"] {
		return s, false, fmt.Errorf("-sasl-token-file goes with -sasl-mechanism oauthbearer, not %s", s.mechanism)
	}
	if given["tls-ca"] {
		s.caFile = *f.caFile
	}
	if given["tls-cert"] {
		s.certFile = *f.certFile
	}
	if given["tls-key"] {
		s.keyFile = *f.keyFile
	}
	useTLS = *f.tls || s.caFile != "" || s.certFile != "" || strings.HasSuffix(strings.ToUpper(s.protocol), "SSL")
	return s, useTLS, nil
}

// connection builds the franz-go options of s.
func (s settings) connection(useTLS bool) (connection, error) {
	c := connection{}
	for _, b := range strings.Split(s.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.seeds = append(c.seeds, b)
		}
	}
	c.opts = []kgo.Opt{kgo.SeedBrokers(c.seeds...)}
	if useTLS {
		cfg, err := s.tlsConfig()
		if err != nil {
			return connection{}, err
		}
		c.opts = append(c.opts, kgo.DialTLSConfig(cfg))
	}
	if s.mechanism != "" || s.user != "" {
		mech, err := s.saslMechanism()
		if err != nil {
			return connection{}, err
		}
		if (mech.Name() == "PLAIN" || mech.Name() == "OAUTHBEARER") && !useTLS {
			// The password, or the bearer token, would cross the network
			// as it is.
			return connection{}, fmt.Errorf("SASL %s sends its credential as it is: use it over TLS (-tls, -tls-ca, or security.protocol=SASL_SSL)", mech.Name())
		}
		c.opts = append(c.opts, kgo.SASL(mech))
	}
	return c, nil
}

// tlsConfig is the TLS configuration of s: the CA file's certificates
// alone, or the system's; a client certificate for mutual TLS.
func (s settings) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.caFile != "" {
		pem, err := os.ReadFile(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("read the CA certificates: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate (a JKS or PKCS12 truststore must be converted to PEM: keytool -exportcert -rfc)", s.caFile)
		}
	}
	switch {
	case s.certFile != "" && s.keyFile != "":
		cert, err := tls.LoadX509KeyPair(s.certFile, s.keyFile)
		if err != nil {
			return nil, fmt.Errorf("read the client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	case s.certFile != "" || s.keyFile != "":
		return nil, errors.New("mutual TLS needs both the client certificate and its key (-tls-cert and -tls-key)")
	}
	return cfg, nil
}

// saslMechanism builds the SASL mechanism s names.
func (s settings) saslMechanism() (sasl.Mechanism, error) {
	name := strings.ToLower(s.mechanism)
	if name == "oauthbearer" {
		if s.tokenFile == "" {
			return nil, errors.New("SASL OAUTHBEARER needs the token's file (-sasl-token-file, or sasl.oauthbearer.token.endpoint.url=file:... in -command-config)")
		}
		return oauthFromFile(s.tokenFile, s.extensions), nil
	}
	if s.user == "" || s.pass == "" {
		return nil, errors.New("SASL needs a user (-sasl-user) and the password in $EOSKIT_SASL_PASSWORD (or both in -command-config)")
	}
	switch name {
	case "scram-sha-256":
		return scram.Auth{User: s.user, Pass: s.pass}.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return scram.Auth{User: s.user, Pass: s.pass}.AsSha512Mechanism(), nil
	case "plain":
		return plain.Auth{User: s.user, Pass: s.pass}.AsMechanism(), nil
	}
	return nil, fmt.Errorf("SASL mechanism %q: want scram-sha-256, scram-sha-512, plain or oauthbearer", s.mechanism)
}

// oauthFromFile is OAUTHBEARER with the token in file (and extensions),
// read at each
// authentication (as Kafka's file-based token retriever does), so that a
// token an identity provider's agent renews in place is taken on the
// next connection.
func oauthFromFile(file string, extensions map[string]string) sasl.Mechanism {
	return oauth.Oauth(func(context.Context) (oauth.Auth, error) {
		raw, err := os.ReadFile(file)
		if err != nil {
			return oauth.Auth{}, fmt.Errorf("read the OAUTHBEARER token: %w", err)
		}
		token := strings.TrimSpace(string(raw))
		if token == "" {
			return oauth.Auth{}, fmt.Errorf("the OAUTHBEARER token file %s is empty", file)
		}
		return oauth.Auth{Token: token, Extensions: extensions}, nil
	})
}
