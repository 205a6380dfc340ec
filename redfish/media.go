package redfish

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"

	"github.com/virtmetal/virtmetal/machine"
)

// cdMediaID is the virtual CD drive, the only virtual media device.
const cdMediaID = "Cd"

// Virtual media hangs under the ComputerSystem, where current schemas put
// it, and under the Manager too, where most real BMCs serve it and where
// Ironic's sushy of Debian 12 (4.3) and other clients still in the field
// look: one drive at two paths. Whichever path a client takes, it sees the
// same state, the same ETag (that of the ComputerSystem's rendering) and
// the same Task. DMTF's Service Validator warns on the Manager path (the
// CSDL marks it deprecated), a price worth a client that deploys.
func mediaCollectionPath(id string) string { return mediaCollectionUnder(systemPath(id)) }
func cdPath(id string) string              { return cdUnder(systemPath(id)) }

func mediaCollectionUnder(owner string) string { return owner + "/VirtualMedia" }
func cdUnder(owner string) string              { return mediaCollectionUnder(owner) + "/" + cdMediaID }

// mediaSite is a virtual media URI resolved: the machine, and the path of
// the resource (its ComputerSystem or its Manager) the URI hangs under.
type mediaSite struct {
	m     machine.Machine
	owner string
}

// answer renders a media resource under the site's owner, with the ETag of
// its rendering under the ComputerSystem: one resource, whichever path.
func (site mediaSite) answer(render func(owner string) map[string]any) result {
	return result{body: render(site.owner), etag: bodyETag(render(systemPath(site.m.ID())))}
}

// mediaSiteOf resolves a virtual media URI, under a system or a manager;
// a machine without virtual media has no media resources at all.
func (s *Server) mediaSiteOf(c *call) (mediaSite, error) {
	idVar, resourceType, ownerPath := "systemID", "ComputerSystem", systemPath
	if _, ok := c.vars["managerID"]; ok {
		idVar, resourceType, ownerPath = "managerID", "Manager", managerPath
	}
	m, err := s.machineFor(c, idVar, resourceType)
	if err != nil {
		return mediaSite{}, err
	}
	if !m.Capabilities().VirtualMedia {
		return mediaSite{}, newError(http.StatusNotFound, msgResourceNotFound, "VirtualMediaCollection", m.ID())
	}
	if id, ok := c.vars["mediaID"]; ok && id != cdMediaID {
		return mediaSite{}, newError(http.StatusNotFound, msgResourceNotFound, "VirtualMedia", id)
	}
	return mediaSite{m: m, owner: ownerPath(m.ID())}, nil
}

func (s *Server) getVirtualMediaCollection(c *call) (result, error) {
	site, err := s.mediaSiteOf(c)
	if err != nil {
		return result{}, err
	}
	return site.answer(func(owner string) map[string]any {
		return collection(typeVirtualMediaColl, mediaCollectionUnder(owner), "Virtual Media Collection", []string{cdUnder(owner)})
	}), nil
}

func (s *Server) getVirtualMedia(c *call) (result, error) {
	site, err := s.mediaSiteOf(c)
	if err != nil {
		return result{}, err
	}
	media, err := site.m.VirtualMedia(c.ctx())
	if err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "VirtualMedia", resourceID: cdMediaID})
	}
	return site.answer(func(owner string) map[string]any { return cdBody(owner, media) }), nil
}

func cdBody(owner string, media machine.VirtualMedia) map[string]any {
	path := cdUnder(owner)
	body := resource(typeVirtualMedia, path, cdMediaID, "Virtual CD")
	body["MediaTypes"] = []string{"CD", "DVD"}
	body["Inserted"] = media.Inserted
	body["WriteProtected"] = media.WriteProtected
	if media.Inserted {
		body["Image"] = media.Image
		body["ConnectedVia"] = "URI"
	} else {
		body["Image"] = nil
		body["ConnectedVia"] = "NotConnected"
	}
	body["Actions"] = map[string]any{
		"#VirtualMedia.InsertMedia": map[string]any{
			"target":              path + "/Actions/VirtualMedia.InsertMedia",
			"@Redfish.ActionInfo": insertMediaActionInfoPath(owner),
			"TransferProtocolType@Redfish.AllowableValues": transferProtocols,
			"TransferMethod@Redfish.AllowableValues":       transferMethods,
		},
		"#VirtualMedia.EjectMedia": map[string]any{"target": path + "/Actions/VirtualMedia.EjectMedia"},
	}
	return body
}

func insertMediaActionInfoPath(owner string) string { return cdUnder(owner) + "/InsertMediaActionInfo" }

// transferProtocols are the TransferProtocolTypes the backends fetch
// images with (machine.CheckImageURL): the one a client names must be the
// Image URL's scheme.
var transferProtocols = []string{"HTTP", "HTTPS"}

// transferMethods: the backends copy the image before the drive reads it
// (KubeVirt's CDI imports it into a volume), which Redfish calls Upload;
// none streams it from the source.
var transferMethods = []string{"Upload"}

func (s *Server) getInsertMediaActionInfo(c *call) (result, error) {
	site, err := s.mediaSiteOf(c)
	if err != nil {
		return result{}, err
	}
	// The drive is a CD: media is always inserted and write-protected.
	always := []string{"true"}
	return site.answer(func(owner string) map[string]any {
		return actionInfo(insertMediaActionInfoPath(owner), "InsertMedia",
			actionParameter{name: "Image", required: true, dataType: "String"},
			actionParameter{name: "Inserted", dataType: "Boolean", allowed: always},
			actionParameter{name: "WriteProtected", dataType: "Boolean", allowed: always},
			actionParameter{name: "TransferProtocolType", dataType: "String", allowed: transferProtocols},
			actionParameter{name: "TransferMethod", dataType: "String", allowed: transferMethods},
		)
	}), nil
}

// insertMediaKnown are the InsertMedia parameters the schema defines.
// Image, Inserted, WriteProtected, TransferProtocolType and TransferMethod
// are honoured (sushy sends TransferProtocolType when a BMC asks for it,
// others always); credentials are refused because images are fetched over
// plain http(s) by the backend.
var (
	insertMediaKnown       = []string{"Image", "Inserted", "WriteProtected", "TransferMethod", "TransferProtocolType", "UserName", "Password"}
	insertMediaUnsupported = []string{"UserName", "Password"}
)

func (s *Server) insertMedia(c *call) (result, error) {
	const action = "InsertMedia"
	site, err := s.mediaSiteOf(c)
	if err != nil {
		return result{}, err
	}
	m := site.m
	params, apiErr := actionParams(c.body, action, insertMediaKnown, []string{"Image"})
	if apiErr != nil {
		return result{}, apiErr
	}
	var problems []message
	for _, key := range insertMediaUnsupported {
		if _, ok := params[key]; ok {
			problems = append(problems, message{key: msgActionParameterNotSupported, args: []string{key, action}})
		}
	}
	image, ok := jsonString(params["Image"])
	if !ok {
		problems = append(problems, message{key: msgActionParameterValueTypeError, args: []string{jsonText(params["Image"]), "Image", action}})
	}
	// The drive is a CD: media is always inserted and write-protected.
	for _, key := range []string{"Inserted", "WriteProtected"} {
		raw, given := params[key]
		if !given {
			continue
		}
		switch value, ok := jsonBool(raw); {
		case !ok:
			problems = append(problems, message{key: msgActionParameterValueTypeError, args: []string{jsonText(raw), key, action}})
		case !value:
			problems = append(problems, message{key: msgActionParameterValueNotInList, args: []string{"false", key, action}})
		}
	}
	if raw, given := params["TransferProtocolType"]; given {
		problems = append(problems, transferProtocolProblems(raw, image)...)
	}
	if raw, given := params["TransferMethod"]; given {
		if _, problem := enumValue(raw, action, "TransferMethod", transferMethods); problem != nil {
			problems = append(problems, *problem)
		}
	}
	if len(problems) > 0 {
		return result{}, badRequest(problems...)
	}
	if apiErr := s.checkImageSource(c.ctx(), image); apiErr != nil {
		return result{}, apiErr
	}
	if err := m.InsertMedia(c.ctx(), image); err != nil {
		return result{}, s.mapBackendError(err, operation{
			resourceType: "VirtualMedia", resourceID: cdMediaID,
			action: action, parameter: "Image", value: image,
		})
	}
	media, err := m.VirtualMedia(c.ctx())
	if err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "VirtualMedia", resourceID: cdMediaID})
	}
	if media.Image != image || media.State == machine.MediaReady || media.State == "" {
		return result{}, nil // the drive reads it now (or it was ejected since)
	}
	t, err := s.followTask(c.ctx(), s.tasks.start(s.now(), m.ID(), image))
	if err != nil {
		return result{}, err
	}
	return s.accepted(t), nil
}

// checkImageSource holds the image URL's host to the destination policy
// event deliveries follow: the backend's importer (KubeVirt's CDI) fetches
// it inside the cluster on the BMC's behalf, so an image must not name
// what only the cluster reaches (metadata, pods, services, the BMC). A
// URL that is no http(s) one is left to the backend's own check.
func (s *Server) checkImageSource(ctx context.Context, image string) *apiError {
	u, err := url.Parse(image)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil
	}
	if err := s.destinations.CheckHost(ctx, u.Hostname()); err != nil {
		return s.mapDestinationError(err, operation{resourceType: "VirtualMedia", resourceID: cdMediaID, action: "InsertMedia", parameter: "Image", value: image})
	}
	return nil
}

// transferProtocolProblems checks a TransferProtocolType: HTTP or HTTPS,
// and the Image URL's own scheme (an https URL fetched as HTTP, or the
// reverse, is not what the client asked for).
func transferProtocolProblems(raw json.RawMessage, image string) []message {
	const param, action = "TransferProtocolType", "InsertMedia"
	value, problem := enumValue(raw, action, param, transferProtocols)
	if problem != nil {
		return []message{*problem}
	}
	scheme, _, _ := strings.Cut(image, "://")
	if !strings.EqualFold(scheme, value) {
		return []message{{key: msgActionParameterValueNotInList, args: []string{value, param, action}}}
	}
	return nil
}
func (s *Server) ejectMedia(c *call) (result, error) {
	site, err := s.mediaSiteOf(c)
	if err != nil {
		return result{}, err
	}
	m := site.m
	if _, apiErr := actionParams(c.body, "EjectMedia", nil, nil); apiErr != nil {
		return result{}, apiErr
	}
	if err := m.EjectMedia(c.ctx()); err != nil {
		return result{}, s.mapBackendError(err, operation{resourceType: "VirtualMedia", resourceID: cdMediaID, action: "EjectMedia"})
	}
	return result{}, nil
}
