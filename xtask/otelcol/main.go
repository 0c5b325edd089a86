// The OpenTelemetry Collector rtrace's fleet tests ship profiles to: the
// Collector's own OTLP receiver (profiles are behind the
// service.profilesSupport feature gate), its debug and otlphttp
// exporters, and `rtracefile`, which writes every profiles request it is
// given to a file as the Collector's own protobuf marshaler encodes it
// (a little-endian u32 length, then the ProfilesData), as contrib's file
// exporter would: contrib is not packaged by Debian, whose packaged
// Collector sources are what this machine can build from. With
// `require_metadata`, a request whose client metadata (its HTTP headers,
// with the receiver's include_metadata) lacks one of the values given is
// refused for good, which the receiver answers with HTTP 400: the tests'
// check that rtrace's headers and compression reach the Collector. Built by
// `cargo xtask otelcol` (xtask/src/otelcol.rs) in GOPATH mode against
// Debian's golang-opentelemetry-collector-dev.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"log"
	"os"
	"sync"

	"go.opentelemetry.io/collector/client"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/confmap/provider/yamlprovider"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/exporterhelper/xexporterhelper"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/exporter/xexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

// fileConfig is rtracefile's configuration: the file it appends to, and
// the client metadata every request must carry.
type fileConfig struct {
	Path            string            `mapstructure:"path"`
	RequireMetadata map[string]string `mapstructure:"require_metadata"`
}

// Validate refuses a configuration without a path.
func (c *fileConfig) Validate() error {
	if c.Path == "" {
		return errors.New("rtracefile: path is not set")
	}
	return nil
}

// fileExporter appends each request to its file, one at a time.
type fileExporter struct {
	mu      sync.Mutex
	path    string
	require map[string]string
}

func (e *fileExporter) push(ctx context.Context, pd pprofile.Profiles) error {
	info := client.FromContext(ctx)
	for k, want := range e.require {
		got := info.Metadata.Get(k)
		if len(got) != 1 || got[0] != want {
			return consumererror.NewPermanent(errors.New("rtracefile: request metadata " + k + " is not " + want))
		}
	}
	m := &pprofile.ProtoMarshaler{}
	b, err := m.MarshalProfiles(pd)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	f, err := os.OpenFile(e.path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := f.Write(append(n[:], b...)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func newFileFactory() exporter.Factory {
	return xexporter.NewFactory(
		component.MustNewType("rtracefile"),
		func() component.Config { return &fileConfig{} },
		xexporter.WithProfiles(func(ctx context.Context, set exporter.Settings, cfg component.Config) (xexporter.Profiles, error) {
			c := cfg.(*fileConfig)
			e := &fileExporter{path: c.Path, require: c.RequireMetadata}
			return xexporterhelper.NewProfiles(ctx, set, cfg, e.push)
		}, component.StabilityLevelDevelopment),
	)
}

func components() (otelcol.Factories, error) {
	var err error
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](
		debugexporter.NewFactory(), otlphttpexporter.NewFactory(), newFileFactory())
	return f, err
}

func main() {
	info := component.BuildInfo{
		Command:     "otelcol-rtrace",
		Description: "the OpenTelemetry Collector of rtrace's fleet tests",
		Version:     "0.152.0-debian",
	}
	set := otelcol.CollectorSettings{
		BuildInfo: info,
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				ProviderFactories: []confmap.ProviderFactory{
					fileprovider.NewFactory(), envprovider.NewFactory(), yamlprovider.NewFactory(),
				},
			},
		},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		log.Fatal(err)
	}
}
