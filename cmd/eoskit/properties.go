package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// readProperties reads a Java properties file as Kafka's tools'
// --command-config takes it: key=value (or key: value) lines, # and !
// comments, a line ending in a backslash continued on the next.
func readProperties(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("-command-config: %w", err)
	}
	defer f.Close()
	props := map[string]string{}
	sc := bufio.NewScanner(f)
	var pending string
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if pending == "" && (line == "" || line[0] == '#' || line[0] == '!') {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			pending += cont
			continue
		}
		line, pending = pending+line, ""
		i := strings.IndexAny(line, "=:")
		if i < 0 {
			return nil, fmt.Errorf("-command-config %s: a line without = or :, %q", path, line)
		}
		props[strings.TrimSpace(line[:i])] = strings.TrimSpace(line[i+1:])
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("-command-config: %w", err)
	}
	return props, nil
}

// jaasField finds name="value" in a sasl.jaas.config.
func jaasField(jaas, name string) string {
	m := regexp.MustCompile(`\b` + name + `\s*=\s*"([^"]*)"`).FindStringSubmatch(jaas)
	if m == nil {
		return ""
	}
	return m[1]
}

// fromProperties reads the connection settings of Kafka's client
// properties (and librdkafka's names for the same), refusing what eoskit
// cannot honour rather than connect otherwise than asked.
func fromProperties(p map[string]string) (settings, error) {
	s := settings{brokers: p["bootstrap.servers"], protocol: strings.ToUpper(p["security.protocol"])}
	switch s.protocol {
	case "", "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL":
	default:
		return s, fmt.Errorf("security.protocol %q: want PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", p["security.protocol"])
	}
	if strings.HasPrefix(s.protocol, "SASL") {
		switch mech := strings.ToUpper(p["sasl.mechanism"]); mech {
		case "", "GSSAPI":
			return s, fmt.Errorf("sasl.mechanism %q: eoskit speaks PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512", p["sasl.mechanism"])
		case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
			s.mechanism = strings.ToLower(mech)
		default:
			return s, fmt.Errorf("sasl.mechanism %s: eoskit's command speaks PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512", mech)
		}
		s.user, s.pass = p["sasl.username"], p["sasl.password"]
		if jaas := p["sasl.jaas.config"]; jaas != "" {
			s.user, s.pass = jaasField(jaas, "username"), jaasField(jaas, "password")
		}
	}
	if alg, set := p["ssl.endpoint.identification.algorithm"]; set && alg == "" {
		return s, fmt.Errorf("ssl.endpoint.identification.algorithm is empty (no host-name check): eoskit always checks the broker's host name")
	}
	s.caFile = p["ssl.ca.location"]
	if loc := p["ssl.truststore.location"]; loc != "" {
		if t := strings.ToUpper(p["ssl.truststore.type"]); t != "PEM" {
			return s, fmt.Errorf("ssl.truststore.type %q: eoskit reads PEM truststores (convert: keytool -exportcert -rfc)", p["ssl.truststore.type"])
		}
		s.caFile = loc
	}
	s.certFile, s.keyFile = p["ssl.certificate.location"], p["ssl.key.location"]
	if loc := p["ssl.keystore.location"]; loc != "" {
		if t := strings.ToUpper(p["ssl.keystore.type"]); t != "PEM" {
			return s, fmt.Errorf("ssl.keystore.type %q: eoskit reads PEM keystores (the certificate and its key in one file)", p["ssl.keystore.type"])
		}
		s.certFile, s.keyFile = loc, loc
	}
	return s, nil
}
