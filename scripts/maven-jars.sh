# maven_jars POM DEST WHAT [MVN_ARGS...] fills DEST with the runtime
# classpath POM declares (`mvn dependency:copy-dependencies` from Maven
# Central), once: a .complete marker makes an interrupted download start
# over instead of leaving a half-filled cache. WHAT names it in the log.
# Sourced by scripts/kafka.sh (the broker's jars) and scripts/streams.sh
# (Kafka Streams, the bench peer); the caller defines log and die.
maven_jars() {
	local pom=$1 dest=$2 what=$3
	shift 3
	[ -f "$dest/.complete" ] && return 0
	command -v mvn >/dev/null || die "mvn not found: install Maven (Debian package 'maven')"
	log "resolving $what from Maven Central into $dest"
	local tmp=$dest.tmp.$$
	rm -rf "$tmp"
	mkdir -p "$tmp"
	mvn -B -q -f "$pom" dependency:copy-dependencies "$@" -DincludeScope=runtime -DoutputDirectory="$tmp" >&2 ||
		{ rm -rf "$tmp"; die "mvn could not resolve $what"; }
	rm -rf "$dest"
	mv "$tmp" "$dest"
	touch "$dest/.complete"
}
