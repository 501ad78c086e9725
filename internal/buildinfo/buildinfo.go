// Package buildinfo is what the commands say of their own build: the
// module version, the VCS revision and the Go version, from the build
// info the Go toolchain stamps (runtime/debug.ReadBuildInfo), for their
// --version and their idemledger_build_info metric.
package buildinfo

import "runtime/debug"

// Info is a binary's build.
type Info struct {
	// Version is the main module's version: "v0.1.0" for a binary built by
	// go install …@v0.1.0 or from a tagged checkout, "(devel)" otherwise.
	Version string
	// Revision is the VCS revision the binary was built from, "" without
	// VCS stamping; Modified says the work tree had changes; Time is the
	// revision's commit time.
	Revision string
	Modified bool
	Time     string
	// GoVersion is the toolchain's version.
	GoVersion string
}

// stampedVersion and stampedRevision are set by a build without the
// module's VCS at hand (the container image's: its context has no .git),
// with -ldflags "-X <this package>.stampedVersion=v0.1.0 -X …stampedRevision=…".
// They win over what the toolchain stamped.
var stampedVersion, stampedRevision string

// Read returns this binary's build.
func Read() Info {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return Info{Version: "unknown"}
	}
	info := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if info.Version == "" {
		info.Version = "(devel)"
	}

	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		case "vcs.time":
			info.Time = s.Value
		}
	}
	if stampedVersion != "" {
		info.Version = stampedVersion
	}
	if stampedRevision != "" {
		info.Revision, info.Modified, info.Time = stampedRevision, false, ""
	}
	return info
}

// String is the line --version prints: "v1.2.3 rev 0123abcd… 2026-12-01T10:00:00Z go1.26.8",
// with "(modified)" after the revision when the work tree had changes.
func (i Info) String() string {
	v := i.Version
	if i.Revision != "" {
		v += " rev " + i.Revision
		if i.Modified {
			v += " (modified)"
		}
		if i.Time != "" {
			v += " " + i.Time
		}
	}
	return v + " " + i.GoVersion
}
